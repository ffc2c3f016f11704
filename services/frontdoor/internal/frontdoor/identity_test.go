package frontdoor

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/hex"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/client-go/transport"
)

// oddExtras are extra keys with bytes a header name cannot hold (and the
// escape character itself), as a webhook authenticator or an
// impersonating client may set them.
var oddExtras = map[string][]string{
	"example.org/a:b@c":    {"v1", "v2"},
	"example.org/k,e;y=z":  {"y"},
	"a%b":                  {"percent"},
	"sp ace/(x)":           {"s"},
	"ünï.example/c":        {"u"},
	"scopes.example.com/x": {"plain"},
}

func init() {
	extra := map[string]authenticationv1.ExtraValue{}
	for k, v := range oddExtras {
		extra[k] = v
	}
	clusterUsers["odd-extras-token"] = authenticationv1.UserInfo{Username: "erin", UID: "e-1", Groups: []string{"system:authenticated"}, Extra: extra}
}

// extrasAsKubeAPIServerReads decodes Impersonate-Extra-* headers as
// kube-apiserver's impersonation filter does: the name's rest lower-cased,
// then unescaped.
func extrasAsKubeAPIServerReads(t *testing.T, h http.Header) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for name, vs := range h {
		rest, ok := strings.CutPrefix(strings.ToLower(name), strings.ToLower(authenticationv1.ImpersonateUserExtraHeaderPrefix))
		if !ok {
			continue
		}
		key, err := url.PathUnescape(rest)
		if err != nil {
			t.Errorf("header %s: kube-apiserver cannot unescape it: %v", name, err)
			continue
		}
		out[key] = append(out[key], vs...)
	}
	return out
}

// TestForwardedExtraKeys (issue 53, point 7): a user whose extra keys hold
// ':', '@', ',', ';', '=', ' ' or '%' is forwarded (not 503, the upstream
// not marked down), with header names exactly as client-go's
// impersonating transport writes them, which kube-apiserver decodes back
// into the same keys and values.
func TestForwardedExtraKeys(t *testing.T) {
	k := newFakeKube(t)
	s := clusterServer(t, k.srv.URL, k.caPEM(), nil)
	for range 3 {
		rec := send(s, http.MethodGet, "/apis/example.com/v1/namespaces/ns1/widgets", "odd-extras-token", nil, nil)
		if rec.Code != http.StatusCreated {
			t.Fatalf("forwarded as erin: %d %s, want the upstream's 201", rec.Code, rec.Body)
		}
	}
	if s.cluster.up.ServersDown() != 0 {
		t.Error("the upstream was marked down")
	}
	got, _ := k.last(t)
	if ex := extrasAsKubeAPIServerReads(t, got.Header); !reflect.DeepEqual(ex, oddExtras) {
		t.Errorf("kube-apiserver reads the extras as %q, want %q", ex, oddExtras)
	}

	// client-go's transport, given the same identity, sends the same
	// header names and values.
	var want http.Header
	rt := transport.NewImpersonatingRoundTripper(transport.ImpersonationConfig{UserName: "erin", UID: "e-1", Extra: oddExtras},
		roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			want = r.Header
			return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
		}))
	if _, err := rt.RoundTrip(httptest.NewRequest(http.MethodGet, "https://kube/", nil)); err != nil {
		t.Fatal(err)
	}
	for name, vs := range want {
		if !strings.HasPrefix(name, "Impersonate-Extra-") {
			continue
		}
		if g := got.Header.Values(name); !slices.Equal(g, vs) {
			t.Errorf("%s: %q, client-go sends %q", name, g, vs)
		}
	}
	var gotNames, wantNames []string
	for name := range got.Header {
		if strings.HasPrefix(name, "Impersonate-Extra-") {
			gotNames = append(gotNames, name)
		}
	}
	for name := range want {
		if strings.HasPrefix(name, "Impersonate-Extra-") {
			wantNames = append(wantNames, name)
		}
	}
	slices.Sort(gotNames)
	slices.Sort(wantNames)
	if !slices.Equal(gotNames, wantNames) {
		t.Errorf("extra headers %q, client-go sends %q", gotNames, wantNames)
	}
}

// x509UIDOID is the subject attribute kube-apiserver reads a client
// certificate's UID from (KEP-4193).
var x509UIDOID = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 57683, 2}

// TestForwardedClientCertIdentity (issue 53, point 7): a user
// authenticated by client certificate is forwarded with the UID and the
// credential-id extra kube-apiserver's x509 authenticator gives the same
// certificate, and a certificate with two UIDs is refused as there.
func TestForwardedClientCertIdentity(t *testing.T) {
	k := newFakeKube(t)
	ca := newTestCA(t, "client-ca")
	s := clusterServer(t, k.srv.URL, k.caPEM(), func(c *Config) {
		c.ClientCAFile = writeFile(t, filepath.Join(t.TempDir(), "client-ca.crt"), ca.pem)
	})
	issue := func(uids ...string) *x509.Certificate {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		subj := pkix.Name{CommonName: "x509-user", Organization: []string{"devs"}}
		for _, u := range uids {
			subj.ExtraNames = append(subj.ExtraNames, pkix.AttributeTypeAndValue{Type: x509UIDOID, Value: u})
		}
		der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
			SerialNumber: big.NewInt(7), Subject: subj,
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}, ca.cert, &key.PublicKey, ca.key)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := x509.ParseCertificate(der)
		return c
	}
	call := func(cert *x509.Certificate) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/apis/authentication.k8s.io/v1/selfsubjectreviews", strings.NewReader(`{}`))
		req.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		return rec
	}
	for _, uid := range []string{"", "u-42"} {
		var cert *x509.Certificate
		if uid == "" {
			cert = issue()
		} else {
			cert = issue(uid)
		}
		if rec := call(cert); rec.Code != http.StatusCreated {
			t.Fatalf("uid %q: %d %s", uid, rec.Code, rec.Body)
		}
		got, _ := k.last(t)
		sum := sha256.Sum256(cert.Raw)
		wantExtra := map[string][]string{"authentication.kubernetes.io/credential-id": {"X509SHA256=" + hex.EncodeToString(sum[:])}}
		if u, g := got.Header.Get("Impersonate-User"), got.Header.Values("Impersonate-Group"); u != "x509-user" || !slices.Equal(g, []string{"devs", "system:authenticated"}) {
			t.Errorf("uid %q: forwarded as %q %q", uid, u, g)
		}
		if g := got.Header.Get("Impersonate-Uid"); g != uid {
			t.Errorf("uid %q: Impersonate-Uid %q", uid, g)
		}
		if ex := extrasAsKubeAPIServerReads(t, got.Header); !reflect.DeepEqual(ex, wantExtra) {
			t.Errorf("uid %q: extras %q, want %q", uid, ex, wantExtra)
		}
	}
	before := k.count()
	if rec := call(issue("u-1", "u-2")); rec.Code != http.StatusUnauthorized {
		t.Errorf("two UIDs: %d %s, want 401", rec.Code, rec.Body)
	}
	if k.count() != before {
		t.Error("a certificate with two UIDs was forwarded")
	}
}

// TestIdentityNotForwardable: an identity with a control character cannot
// be put in headers: that request is refused with 500, and the upstream
// is not marked down for everyone else.
func TestIdentityNotForwardable(t *testing.T) {
	k := newFakeKube(t)
	s := clusterServer(t, k.srv.URL, k.caPEM(), nil)
	rec := httptest.NewRecorder()
	s.cluster.up.Serve(rec, httptest.NewRequest(http.MethodGet, "/api/v1/namespaces/ns1/configmaps", nil),
		(&User{Name: "mallory", Extra: map[string][]string{"k": {"a\r\nImpersonate-Group: system:masters"}}}).Info())
	if code, reason, _ := statusOf(t, rec.Body.Bytes()); rec.Code != http.StatusInternalServerError || code != 500 || reason != "InternalError" {
		t.Errorf("%d %s", rec.Code, rec.Body)
	}
	if k.count() != 0 || s.cluster.up.ServersDown() != 0 {
		t.Errorf("forwarded %d, upstream servers down %d", k.count(), s.cluster.up.ServersDown())
	}
	if rec := send(s, http.MethodGet, "/apis/example.com/v1/widgets", tokAdmin, nil, nil); rec.Code != http.StatusCreated {
		t.Errorf("next user: %d %s", rec.Code, rec.Body)
	}
}

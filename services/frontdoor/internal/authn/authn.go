package authn

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/csv"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	k8sauthn "k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/request/websocket"
	x509request "k8s.io/apiserver/pkg/authentication/request/x509"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	saJWT "k8s.io/apiserver/pkg/authentication/token/jwt"
	"k8s.io/apiserver/pkg/authentication/user"

	"herald.dev/services/frontdoor/internal/trust"
)

// Well-known users and groups, as kube-apiserver names them.
const (
	groupAuthenticated   = "system:authenticated"
	groupUnauthenticated = "system:unauthenticated"
	userAnonymous        = "system:anonymous"
	saUserPrefix         = "system:serviceaccount:"
	saGroup              = "system:serviceaccounts"
	legacySAIssuer       = "kubernetes/serviceaccount"
)

// User is an authenticated identity.
type User struct {
	Name   string
	UID    string
	Groups []string
	// Extra is what the cluster's TokenReview (or an impersonation, or a
	// client certificate's credential-id) says besides (cluster mode:
	// forwarded as Impersonate-Extra-*).
	Extra map[string][]string
	// Method names the authenticator that vouched for the user (audit).
	Method string
	// bound is what a service-account token verified here (standalone) is
	// bound to, from its verified claims; nil for other users (bound.go
	// reads a reviewed token's binding from its extra).
	bound *binding
}

func (u *User) inGroup(g string) bool { return slices.Contains(u.Groups, g) }

// Info is u as k8s.io/apiserver's user.Info.
func (u *User) Info() user.Info {
	return &user.DefaultInfo{Name: u.Name, UID: u.UID, Groups: u.Groups, Extra: u.Extra}
}

// Authenticator resolves a request's credentials into a User, as
// kube-apiserver's union of authenticators does:
//
//   - the first authenticator that accepts the request's credentials wins;
//   - credentials that are present but invalid (a token nobody knows, an
//     expired or forged JWT, a certificate of another CA) are a 401, even
//     when anonymous access is on;
//   - a request with no credentials at all is system:anonymous when
//     anonymous access is on, else a 401.
//
// Every authenticated user is also in system:authenticated. The secrets
// themselves never leave this file: errors name the reason, not the token.
type Authenticator struct {
	Tokens    *trust.Source[TokenFile]     // nil: no static tokens
	ClientCAs *trust.Source[x509.CertPool] // nil: client certificates ignored
	SAKeys    *trust.Source[SAKeySet]      // nil: no service-account tokens
	Issuers   []string
	Audiences []string
	Anonymous bool
	Now       func() time.Time
}

// ErrNoCredentials: the request carries nothing this authenticator checks.
var ErrNoCredentials = errors.New("no credentials")

// Authenticate returns the request's user, or an error saying why not
// (ErrNoCredentials when there were none).
func (a *Authenticator) Authenticate(r *http.Request) (*User, error) {
	var errs []error
	if u, err := a.x509(r.TLS); err == nil {
		return finish(u), nil
	} else if !errors.Is(err, ErrNoCredentials) {
		errs = append(errs, err)
	}
	if u, err := a.bearer(r.Header.Get("Authorization")); err == nil {
		return finish(u), nil
	} else if !errors.Is(err, ErrNoCredentials) {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if a.Anonymous {
		return &User{Name: userAnonymous, Groups: []string{groupUnauthenticated}, Method: "anonymous"}, nil
	}
	return nil, ErrNoCredentials
}

// WebSocketBearer moves a bearer token sent as a WebSocket subprotocol
// ("base64url.bearer.authorization.k8s.io.<base64url token>": browsers
// cannot set Authorization on a WebSocket, and kubectl's and client-go's
// WebSocket clients may use it too) into the request's Authorization
// header, where the authenticators check it like any other, and removes it
// from Sec-WebSocket-Protocol so that it is never forwarded. Parsing and
// the rules (one token, another subprotocol present to be echoed back) are
// kube-apiserver's own protocol authenticator's. An Authorization header
// the client sent wins, as in kube-apiserver, and the subprotocol is
// removed all the same.
func WebSocketBearer(r *http.Request) error {
	if r.Header.Get("Sec-WebSocket-Protocol") == "" {
		return nil
	}
	var tok string
	capture := k8sauthn.TokenFunc(func(_ context.Context, t string) (*k8sauthn.Response, bool, error) {
		tok = t
		return &k8sauthn.Response{User: &user.DefaultInfo{}}, true, nil
	})
	if _, _, err := websocket.NewProtocolAuthenticator(capture).AuthenticateRequest(r); err != nil {
		return fmt.Errorf("websocket: %w", err)
	}
	if tok != "" && r.Header.Get("Authorization") == "" {
		r.Header.Set("Authorization", "Bearer "+tok)
	}
	return nil
}

func finish(u *User) *User {
	if !u.inGroup(groupAuthenticated) {
		u.Groups = append(u.Groups, groupAuthenticated)
	}
	return u
}

// x509 verifies a client certificate against the client CA: CN is the
// user, O the groups, as kube-apiserver reads them (with its uid and
// credential-id extra). The TLS layer only requests certificates
// (tls.RequestClientCert) so that a bad one is a Kubernetes 401 here rather
// than a failed handshake.
func (a *Authenticator) x509(cs *tls.ConnectionState) (*User, error) {
	if a.ClientCAs == nil || cs == nil || len(cs.PeerCertificates) == 0 {
		return nil, ErrNoCredentials
	}
	leaf := cs.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	chains, err := leaf.Verify(x509.VerifyOptions{
		Roots:         a.ClientCAs.Get(),
		Intermediates: inter,
		CurrentTime:   a.Now(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, fmt.Errorf("x509: verifying certificate %q: %w", leaf.Subject.CommonName, err)
	}
	// The identity kube-apiserver's x509 authenticator gives the same
	// certificate (its own conversion): the UID from the subject's UID
	// attribute (AllowParsingUserUIDFromCertAuth, on by default), the
	// credential-id extra X509SHA256=<fingerprint>. In cluster mode they
	// are forwarded as such.
	resp, ok, err := x509request.CommonNameUserConversion.User(chains[0])
	if err != nil {
		return nil, fmt.Errorf("x509: certificate %q: %w", leaf.Subject.CommonName, err)
	}
	if !ok {
		return nil, errors.New("x509: certificate has no common name")
	}
	info := resp.User
	return &User{Name: info.GetName(), UID: info.GetUID(), Groups: slices.Clone(info.GetGroups()), Extra: info.GetExtra(), Method: "x509"}, nil
}

// bearer authenticates an Authorization header: static tokens first (a
// hash lookup), then service-account JWTs.
func (a *Authenticator) bearer(h string) (*User, error) {
	scheme, tok, found := strings.Cut(h, " ")
	if !found || !strings.EqualFold(scheme, "bearer") {
		return nil, ErrNoCredentials
	}
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return nil, ErrNoCredentials
	}
	if a.Tokens != nil {
		if u, ok := a.Tokens.Get().users[sha256.Sum256([]byte(tok))]; ok {
			u.Groups = slices.Clone(u.Groups)
			u.Method = "token"
			return &u, nil
		}
	}
	if a.SAKeys != nil && strings.Count(tok, ".") == 2 {
		return a.serviceAccount(tok)
	}
	return nil, errors.New("token: unknown bearer token")
}

// saClaims are the claims of service-account tokens, bound (kubernetes.io)
// and legacy (kubernetes.io/serviceaccount/...).
type saClaims struct {
	jwt.RegisteredClaims
	K8s *struct {
		Namespace      string `json:"namespace"`
		ServiceAccount struct {
			Name string `json:"name"`
			UID  string `json:"uid"`
		} `json:"serviceaccount"`
		// The object a TokenRequest bound the token to: a pod (which
		// also names its node), a node or a secret.
		Pod    *claimRef `json:"pod,omitempty"`
		Node   *claimRef `json:"node,omitempty"`
		Secret *claimRef `json:"secret,omitempty"`
	} `json:"kubernetes.io,omitempty"`
	LegacyNamespace string `json:"kubernetes.io/serviceaccount/namespace,omitempty"`
	LegacyName      string `json:"kubernetes.io/serviceaccount/service-account.name,omitempty"`
	LegacyUID       string `json:"kubernetes.io/serviceaccount/service-account.uid,omitempty"`
}

// claimRef names a bound object in a service-account token's claims.
type claimRef struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

// serviceAccount verifies a service-account JWT: signature by one of the
// keys (RS*/ES* only: never "none" or HMAC with a public key), an accepted
// issuer, an accepted audience (legacy tokens have none), an expiry (legacy
// Secret-based tokens, which have none, are refused), not expired and not
// before its time, and a subject of the form
// system:serviceaccount:<namespace>:<name> that agrees with the private
// claims. The user is what kube-apiserver makes of such a token
// (serviceaccount.ServiceAccountInfo: the pod and node it names and the
// credential id in its extra); the pod, node or secret it is bound to is
// checked against the cache on every request (bound.go), as in cluster
// mode. The ServiceAccount itself is not looked up.
func (a *Authenticator) serviceAccount(raw string) (*User, error) {
	keys := a.SAKeys.Get().keys
	if len(keys) == 0 {
		return nil, errors.New("service account token: no verification keys (the key files do not load)")
	}
	var claims saClaims
	p := jwt.NewParser(
		jwt.WithValidMethods([]string{"RS256", "RS384", "RS512", "ES256", "ES384", "ES512"}),
		jwt.WithTimeFunc(a.Now),
		jwt.WithLeeway(time.Minute/2),
		// A token without exp would be valid forever: leaked, it could only
		// be revoked by rotating the signing key.
		jwt.WithExpirationRequired(),
	)
	_, err := p.ParseWithClaims(raw, &claims, func(*jwt.Token) (any, error) {
		return jwt.VerificationKeySet{Keys: keys}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("service account token: %w", err)
	}
	if !slices.Contains(a.Issuers, claims.Issuer) {
		return nil, fmt.Errorf("service account token: issuer %q is not accepted", claims.Issuer)
	}
	if claims.Issuer != legacySAIssuer && !slices.ContainsFunc(claims.Audience, func(aud string) bool { return slices.Contains(a.Audiences, aud) }) {
		return nil, errors.New("service account token: no accepted audience")
	}
	rest, ok := strings.CutPrefix(claims.Subject, saUserPrefix)
	ns, name, ok2 := strings.Cut(rest, ":")
	if !ok || !ok2 || ns == "" || name == "" || strings.Contains(name, ":") {
		return nil, fmt.Errorf("service account token: subject %q is not a service account", claims.Subject)
	}
	sa := serviceaccount.ServiceAccountInfo{Namespace: ns, Name: name, UID: claims.LegacyUID, CredentialID: saJWT.CredentialIDForJTI(claims.ID)}
	var b *binding
	switch {
	case claims.K8s != nil:
		if claims.K8s.Namespace != ns || claims.K8s.ServiceAccount.Name != name {
			return nil, errors.New("service account token: kubernetes.io claims disagree with the subject")
		}
		k := claims.K8s
		sa.UID = k.ServiceAccount.UID
		b = &binding{namespace: ns, pod: k.Pod.ref(), secret: k.Secret.ref()}
		if k.Pod != nil {
			sa.PodName, sa.PodUID = k.Pod.Name, k.Pod.UID
		} else {
			b.node = k.Node.ref() // a pod-bound token's node is not a binding
		}
		if k.Node != nil {
			sa.NodeName, sa.NodeUID = k.Node.Name, k.Node.UID
		}
	case claims.LegacyNamespace != "" || claims.LegacyName != "":
		if claims.LegacyNamespace != ns || claims.LegacyName != name {
			return nil, errors.New("service account token: legacy claims disagree with the subject")
		}
		b = &binding{namespace: ns, secret: secretClaims(raw, ns)}
	}
	info := sa.UserInfo()
	return &User{Name: info.GetName(), UID: info.GetUID(), Groups: info.GetGroups(), Extra: info.GetExtra(), Method: "serviceaccount", bound: b}, nil
}

// ref is the bound object c names (nil for none).
func (c *claimRef) ref() *objectRef {
	if c == nil {
		return nil
	}
	return &objectRef{name: c.Name, uid: c.UID}
}

// TokenFile is a loaded static token file.
type TokenFile struct {
	// Keyed by the token's SHA-256: a lookup's timing can only tell an
	// attacker about hashes, never about a token's prefix.
	users map[[32]byte]User
}

// LoadTokens reads a static token file (kube-apiserver's CSV format).
func LoadTokens(path string) (*TokenFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.FieldsPerRecord = -1
	r.TrimLeadingSpace = true
	r.Comment = '#'
	a := &TokenFile{users: map[[32]byte]User{}}
	for line := 1; ; line++ {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("token file %s: %w", path, err)
		}
		if len(rec) < 2 || rec[0] == "" || rec[1] == "" {
			return nil, fmt.Errorf("token file %s: record %d needs at least token,user", path, line)
		}
		u := User{Name: rec[1]}
		if len(rec) > 2 {
			u.UID = rec[2]
		}
		if len(rec) > 3 && rec[3] != "" {
			for _, g := range strings.Split(rec[3], ",") {
				if g = strings.TrimSpace(g); g != "" {
					u.Groups = append(u.Groups, g)
				}
			}
		}
		a.users[sha256.Sum256([]byte(rec[0]))] = u
	}
	// An empty file is valid: it revokes every token (so does a file that
	// fails to parse or is deleted, reloaded: see trust.Source).
	return a, nil
}

// LoadCertPool reads the client CA bundle. An empty file (or one of only
// whitespace) is an empty pool, so that emptying it revokes every client
// certificate; anything else must be PEM certificates.
func LoadCertPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if len(bytes.TrimSpace(b)) > 0 && !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("client CA %s: no PEM certificates", path)
	}
	return pool, nil
}

// SAKeySet holds the public keys that verify service-account tokens.
type SAKeySet struct {
	keys []jwt.VerificationKey
}

// LoadSAKeys reads public keys, certificates or private keys (whose public
// half is used), as kube-apiserver's --service-account-key-file accepts.
func LoadSAKeys(paths []string) (*SAKeySet, error) {
	set := &SAKeySet{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("service account key: %w", err)
		}
		n := 0
		for {
			var blk *pem.Block
			blk, b = pem.Decode(b)
			if blk == nil {
				break
			}
			k, err := publicKey(blk)
			if err != nil {
				return nil, fmt.Errorf("service account key %s: %w", p, err)
			}
			if k != nil {
				set.keys = append(set.keys, k)
				n++
			}
		}
		if n == 0 {
			return nil, fmt.Errorf("service account key %s: no RSA or ECDSA key", p)
		}
	}
	return set, nil
}

func publicKey(blk *pem.Block) (crypto.PublicKey, error) {
	var k any
	var err error
	switch blk.Type {
	case "PUBLIC KEY":
		k, err = x509.ParsePKIXPublicKey(blk.Bytes)
	case "RSA PUBLIC KEY":
		k, err = x509.ParsePKCS1PublicKey(blk.Bytes)
	case "CERTIFICATE":
		var c *x509.Certificate
		if c, err = x509.ParseCertificate(blk.Bytes); err == nil {
			k = c.PublicKey
		}
	case "RSA PRIVATE KEY":
		k, err = x509.ParsePKCS1PrivateKey(blk.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(blk.Bytes)
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(blk.Bytes)
	default:
		return nil, nil // e.g. EC PARAMETERS
	}
	if err != nil {
		return nil, err
	}
	switch k := k.(type) {
	case *rsa.PublicKey, *ecdsa.PublicKey:
		return k, nil
	case *rsa.PrivateKey:
		return &k.PublicKey, nil
	case *ecdsa.PrivateKey:
		return &k.PublicKey, nil
	}
	return nil, fmt.Errorf("unsupported key type %T (want RSA or ECDSA)", k)
}

// NoTokens is a token file that accepts no token: the value of a token
// file that does not load (it fails closed).
func NoTokens() *TokenFile { return &TokenFile{users: map[[32]byte]User{}} }

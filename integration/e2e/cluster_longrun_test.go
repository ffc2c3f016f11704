package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Issue 53, acceptance 3: `kubectl logs -f` and a watch that Herald
// forwards to kube-apiserver last past five minutes through Herald, whose
// --write-timeout stays at its default (60 s): forwarded long-running
// answers used to be cut at their first write after it. Both streams start
// as soon as the cluster is up and run while TestClusterMode's other
// subtests do; its subtest long-streams then waits out the rest of the
// duration and checks that every line and every event arrived, in order,
// and that both streams are still open.

// longStreamEnv sets how long the streams must last (a Go duration; the
// default is acceptance 3's five minutes and a half): shorter while
// developing, never shorter than a minute for the result to mean anything.
const longStreamEnv = "HERALD_LONG_STREAM"

func longStreamDuration(t *testing.T) time.Duration {
	d := 5*time.Minute + 30*time.Second
	if v := os.Getenv(longStreamEnv); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatalf("%s=%q: %v", longStreamEnv, v, err)
		}
	}
	return d
}

// longStreamPace: a log line, and a Secret update, this often.
const longStreamPace = 2 * time.Second

// tickingKubelet serves the kubelet API's container logs as a line every
// longStreamPace ("tick 1", "tick 2", ...) until the request ends.
type tickingKubelet struct {
	srv     *httptest.Server
	written atomic.Int64 // lines written and flushed
}

func startTickingKubelet(t *testing.T, c *clusterEnv) *tickingKubelet {
	cert, err := tls.LoadX509KeyPair(c.PKI.CertFile, c.PKI.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	k := &tickingKubelet{}
	mux := http.NewServeMux()
	mux.HandleFunc("/containerLogs/{ns}/{pod}/{container}", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("follow") != "true" {
			http.Error(w, "only followed logs here", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		rc := http.NewResponseController(w)
		tick := time.NewTicker(longStreamPace)
		defer tick.Stop()
		for i := int64(1); ; i++ {
			if _, err := fmt.Fprintf(w, "tick %d\n", i); err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
			k.written.Store(i)
			select {
			case <-tick.C:
			case <-r.Context().Done():
				return
			}
		}
	})
	k.srv = httptest.NewUnstartedServer(mux)
	k.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	k.srv.StartTLS()
	t.Cleanup(k.srv.Close)
	return k
}

// startLongStreams registers a kubelet (node kubelet-long, pod ticker in
// namespace longrun), then starts `kubectl logs -f` of the pod through
// Herald and a watch through Herald of a Secret (not cached here: kube-
// apiserver answers it) that is updated every longStreamPace. The
// returned check is TestClusterMode's subtest long-streams.
func startLongStreams(t *testing.T, c *clusterEnv) func(*testing.T) {
	d := longStreamDuration(t)
	ctx := testContext(t, d+10*time.Minute) // the other subtests run meanwhile
	setup := testContext(t, time.Minute)
	k := startTickingKubelet(t, c)
	_, port, _ := net.SplitHostPort(k.srv.Listener.Addr().String())
	must := func(what string, want, code int, body string) {
		if code != want {
			t.Fatalf("%s: %d %s", what, code, clip(body))
		}
	}
	code, body := c.call(setup, c.kubeURL, c.Token, http.MethodPost, "/api/v1/nodes", `{"apiVersion":"v1","kind":"Node","metadata":{"name":"kubelet-long"}}`)
	must("create node", http.StatusCreated, code, body)
	code, body = c.call(setup, c.kubeURL, c.Token, http.MethodPatch, "/api/v1/nodes/kubelet-long/status",
		fmt.Sprintf(`{"status":{"addresses":[{"type":"InternalIP","address":"127.0.0.1"}],"daemonEndpoints":{"kubeletEndpoint":{"Port":%s}}}}`, port))
	must("node status", http.StatusOK, code, body)
	// No controller creates the namespace's default ServiceAccount here.
	code, body = c.call(setup, c.kubeURL, c.Token, http.MethodPost, "/api/v1/namespaces", `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"longrun"}}`)
	must("create namespace", http.StatusCreated, code, body)
	code, body = c.call(setup, c.kubeURL, c.Token, http.MethodPost, "/api/v1/namespaces/longrun/serviceaccounts", `{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"default"}}`)
	must("create service account", http.StatusCreated, code, body)
	code, body = c.call(setup, c.kubeURL, c.Token, http.MethodPost, "/api/v1/namespaces/longrun/pods",
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"ticker"},"spec":{"nodeName":"kubelet-long","automountServiceAccountToken":false,
		"containers":[{"name":"c","image":"registry.k8s.io/pause:3.10"}]}}`)
	must("create pod", http.StatusCreated, code, body)
	code, body = c.call(setup, c.kubeURL, c.Token, http.MethodPost, "/api/v1/namespaces/longrun/secrets",
		`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"ticker"},"stringData":{"tick":"0"}}`)
	must("create secret", http.StatusCreated, code, body)
	var created objMeta
	json.Unmarshal([]byte(body), &created)
	start := time.Now()

	// kubectl logs -f through Herald (kubectl speaks HTTP/2).
	logs := exec.CommandContext(ctx, c.kubectl, "--kubeconfig", c.heraldCfg["admin"], "-n", "longrun", "logs", "-f", "ticker")
	stdout, err := logs.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var logsErr bytes.Buffer
	logs.Stderr = &logsErr
	if err := logs.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var lines []string
	logsDone := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			mu.Lock()
			lines = append(lines, sc.Text())
			mu.Unlock()
		}
		logsDone <- logs.Wait()
	}()

	// The watch through Herald (HTTP/1.1), from the Secret's creation.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.PKI.CAPEM)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.FrontdoorURL+
		"/api/v1/namespaces/longrun/secrets?watch=true&fieldSelector=metadata.name%3Dticker&resourceVersion="+created.Metadata.ResourceVersion, nil)
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("watch secrets through Herald: %d %s", resp.StatusCode, clip(string(b)))
	}
	var ticks []string // the Secret's tick per event, in order
	watchDone := make(chan error, 1)
	go func() {
		defer resp.Body.Close()
		dec := json.NewDecoder(resp.Body)
		for {
			var ev struct {
				Type   string
				Object struct {
					Data map[string][]byte // base64 in JSON
				}
			}
			if err := dec.Decode(&ev); err != nil {
				watchDone <- err
				return
			}
			mu.Lock()
			ticks = append(ticks, ev.Type+" "+string(ev.Object.Data["tick"]))
			mu.Unlock()
		}
	}()

	// The Secret changes every longStreamPace (straight at kube-apiserver).
	var updated atomic.Int64
	writerDone := make(chan struct{})
	writerCtx, stopWriter := context.WithCancel(ctx)
	go func() {
		defer close(writerDone)
		tick := time.NewTicker(longStreamPace)
		defer tick.Stop()
		for i := int64(1); ; i++ {
			select {
			case <-tick.C:
			case <-writerCtx.Done():
				return
			}
			patch := fmt.Sprintf(`{"stringData":{"tick":%q}}`, strconv.FormatInt(i, 10))
			if code, body := c.call(writerCtx, c.kubeURL, c.Token, http.MethodPatch, "/api/v1/namespaces/longrun/secrets/ticker", patch); code != http.StatusOK {
				if writerCtx.Err() == nil {
					t.Errorf("update %d of the Secret: %d %s", i, code, clip(body))
				}
				return
			}
			updated.Store(i)
		}
	}()
	t.Cleanup(func() { stopWriter(); <-writerDone })

	return func(t *testing.T) {
		t.Logf("streams open for %s; waiting until %s", time.Since(start).Round(time.Second), d)
		select {
		case <-time.After(time.Until(start.Add(d))): // the duration under test
		case err := <-logsDone:
			t.Fatalf("kubectl logs -f ended after %s: %v; stderr %s", time.Since(start).Round(time.Second), err, logsErr.String())
		case err := <-watchDone:
			t.Fatalf("the watch through Herald ended after %s: %v", time.Since(start).Round(time.Second), err)
		}
		stopWriter()
		<-writerDone
		wantLines, wantTicks := k.written.Load(), updated.Load()
		// What was sent before now is on its way: give it a little time
		// to arrive (polling with a deadline).
		caughtUp := func() bool {
			mu.Lock()
			defer mu.Unlock()
			return int64(len(lines)) >= wantLines && int64(len(ticks)) >= wantTicks
		}
		for deadline := time.Now().Add(15 * time.Second); !caughtUp() && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		lasted := time.Since(start).Round(time.Second)
		select {
		case err := <-logsDone:
			t.Errorf("kubectl logs -f ended after %s: %v; stderr %s", lasted, err, logsErr.String())
			logsDone <- err // for the end below
		case err := <-watchDone:
			t.Errorf("the watch through Herald ended after %s: %v", lasted, err)
		default:
		}
		logs.Process.Kill() // what it printed is in; its stderr can be read
		<-logsDone
		mu.Lock()
		gotLines, gotTicks := slices.Clone(lines), slices.Clone(ticks)
		mu.Unlock()
		var want []string
		for i := int64(1); i <= int64(len(gotLines)); i++ {
			want = append(want, fmt.Sprintf("tick %d", i))
		}
		if int64(len(gotLines)) < wantLines || !reflect.DeepEqual(gotLines, want) {
			t.Errorf("kubectl logs -f over %s: %d lines of the %d the kubelet wrote (first %q, last %q); stderr %s",
				lasted, len(gotLines), wantLines, first(gotLines), last(gotLines), logsErr.String())
		}
		want = want[:0]
		for i := int64(1); i <= int64(len(gotTicks)); i++ {
			want = append(want, fmt.Sprintf("MODIFIED %d", i))
		}
		if int64(len(gotTicks)) < wantTicks || !reflect.DeepEqual(gotTicks, want) {
			t.Errorf("watch through Herald over %s: %d events of %d updates (first %q, last %q)",
				lasted, len(gotTicks), wantTicks, first(gotTicks), last(gotTicks))
		}
		if lasted < d {
			t.Errorf("the streams were checked after %s, before %s", lasted, d)
		}
		t.Logf("after %s: kubectl logs -f printed %d lines (kubelet wrote %d), the watch delivered %d events (%d updates)",
			lasted, len(gotLines), wantLines, len(gotTicks), wantTicks)
	}
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

func last(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[len(s)-1]
}

// selfSubjectReview is who the answering kube-apiserver says the caller is.
type selfSubjectReview struct {
	Status struct {
		UserInfo struct {
			Username string              `json:"username"`
			UID      string              `json:"uid"`
			Groups   []string            `json:"groups"`
			Extra    map[string][]string `json:"extra"`
		} `json:"userInfo"`
	} `json:"status"`
}

// reviewSelf posts a SelfSubjectReview to base with client and headers
// hdr, and returns who the cluster says the caller is.
func reviewSelf(t *testing.T, ctx context.Context, client *http.Client, base string, hdr map[string]string) selfSubjectReview {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/apis/authentication.k8s.io/v1/selfsubjectreviews",
		strings.NewReader(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("SelfSubjectReview at %s: %v", base, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("SelfSubjectReview at %s: %d %s", base, resp.StatusCode, clip(string(b)))
	}
	var r selfSubjectReview
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	slices.Sort(r.Status.UserInfo.Groups)
	return r
}

// testForwardedIdentity (issue 53, point 7): kube-apiserver sees, through
// Herald, the user it sees directly: an impersonated user whose extra key
// holds ':' and '@' (Herald used to send a header name the transport
// refused: 503), and a user of a client certificate (Herald used to
// forward it without kube-apiserver's credential-id extra).
func testForwardedIdentity(t *testing.T, ctx context.Context, c *clusterEnv) {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.PKI.CAPEM)
	tokenClient := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	asErin := map[string]string{
		"Authorization":    "Bearer " + c.Token, // system:masters may impersonate
		"Impersonate-User": "erin",
		// The key example.org/a:b@c, escaped as client-go escapes it.
		"Impersonate-Extra-Example.org%2fa%3ab%40c": "v",
	}
	direct := reviewSelf(t, ctx, tokenClient, c.kubeURL, asErin)
	via := reviewSelf(t, ctx, tokenClient, c.FrontdoorURL, asErin)
	if want := map[string][]string{"example.org/a:b@c": {"v"}}; !reflect.DeepEqual(direct.Status.UserInfo.Extra, want) {
		t.Errorf("kube-apiserver read the impersonated extra as %q, want %q", direct.Status.UserInfo.Extra, want)
	}
	if !reflect.DeepEqual(via, direct) {
		t.Errorf("through Herald the cluster sees %+v, directly %+v", via.Status.UserInfo, direct.Status.UserInfo)
	}
	// Herald keeps forwarding (the upstream was not marked down).
	if code, body := c.call(ctx, c.FrontdoorURL, c.Token, http.MethodGet, "/api/v1/namespaces/default/secrets", ""); code != http.StatusOK {
		t.Errorf("after the odd extra: %d %s", code, clip(body))
	}

	// A client certificate of the cluster's client CA (the stack's
	// internal client certificate: CN herald-internal-client).
	cert, err := tls.LoadX509KeyPair(c.PKI.ClientCertFile, c.PKI.ClientKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	certClient := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}}
	direct = reviewSelf(t, ctx, certClient, c.kubeURL, nil)
	via = reviewSelf(t, ctx, certClient, c.FrontdoorURL, nil)
	if id := direct.Status.UserInfo.Extra["authentication.kubernetes.io/credential-id"]; len(id) != 1 || !strings.HasPrefix(id[0], "X509SHA256=") {
		t.Errorf("kube-apiserver's credential-id of the certificate: %q", id)
	}
	if !reflect.DeepEqual(via, direct) {
		t.Errorf("client certificate: through Herald the cluster sees %+v, directly %+v", via.Status.UserInfo, direct.Status.UserInfo)
	}
}

package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"herald.dev/integration/stack"
)

// Cluster mode (issue 15): a real kube-apiserver v1.37.2 (authorization
// Node,RBAC) on the stack's etcd, Herald's frontdoor in front of it with
// --upstream.kubeconfig, and every client pointed at Herald only. Herald's
// own access to the cluster is exactly the ClusterRole of
// deploy/k8s/overlays/cluster (applied by the operator, here directly to
// kube-apiserver, before anything points at Herald). kube-apiserver is
// asked directly only to compare answers ("as kube-apiserver does").

// Identities in kube-apiserver's token file. Herald knows none of them but
// the stack's admin token: they are authenticated by TokenReview.
const (
	tokHerald = "herald-upstream-token" // Herald's own (user herald)
	tokAlice  = "alice-token"           // a Role in namespace demo
	tokNode1  = "node-1-token"          // system:node:node-1
)

// kubeAPIServerBinary is kube-apiserver v1.37.2, built once and cached
// (stack.KubeAPIServerBinary; minutes the first time on a machine).
func kubeAPIServerBinary(t *testing.T) string {
	bin, err := stack.KubeAPIServerBinary(tlog{t})
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// tlog writes build progress lines to the test log.
type tlog struct{ t *testing.T }

func (l tlog) Write(b []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// clusterEnv is the stack in cluster mode.
type clusterEnv struct {
	*env
	kubeURL   string
	dir       string
	stopKube  func()
	kubectl   string
	heraldCfg map[string]string // user -> kubeconfig through Herald
	kubeCfg   map[string]string // user -> kubeconfig straight to kube-apiserver
}

// clusterOptions adjust startCluster: more lines for kube-apiserver's token
// file (token,user,uid,"groups") and more frontdoor flags.
type clusterOptions struct {
	tokens         []string
	frontdoorFlags []string
}

func startCluster(t *testing.T, opts ...clusterOptions) *clusterEnv {
	t.Helper()
	var o clusterOptions
	for _, x := range opts {
		o.tokens = append(o.tokens, x.tokens...)
		o.frontdoorFlags = append(o.frontdoorFlags, x.frontdoorFlags...)
	}
	kubectl := kubectlPath(t)
	bin := kubeAPIServerBinary(t)
	// PodTemplates keep a window of three events: list-older-than-window.
	e := startStack(t, stack.Options{Flags: map[string][]string{"cache": {"--watch-cache-sizes=podtemplates#3"}}})
	ctx := testContext(t, 4*time.Minute)
	dir := t.TempDir()
	c := &clusterEnv{env: e, dir: dir, kubectl: kubectl, heraldCfg: map[string]string{}, kubeCfg: map[string]string{}}

	tokens := filepath.Join(dir, "tokens.csv")
	os.WriteFile(tokens, []byte(fmt.Sprintf("%s,herald-admin,herald-admin,\"system:masters\"\n%s,herald,herald-uid\n%s,alice,alice-uid\n%s,system:node:node-1,node-1-uid,\"system:nodes\"\n",
		e.Token, tokHerald, tokAlice, tokNode1)+strings.Join(append(o.tokens, ""), "\n")), 0o600)
	addr := freePort(t)
	_, port, _ := net.SplitHostPort(addr)
	logf, _ := os.Create(filepath.Join(dir, "kube-apiserver.log"))
	cmd := exec.Command(bin,
		"--etcd-servers="+e.EtcdEndpoint,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+port,
		"--tls-cert-file="+e.PKI.CertFile, "--tls-private-key-file="+e.PKI.KeyFile, "--cert-dir="+filepath.Join(dir, "certs"),
		"--client-ca-file="+e.PKI.CAFile,
		"--token-auth-file="+tokens, "--anonymous-auth=false",
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+e.PKI.KeyFile, "--service-account-signing-key-file="+e.PKI.KeyFile,
		"--service-cluster-ip-range=10.96.0.0/16",
		"--endpoint-reconciler-type=none",
		// The streaming test's kubelet serves with the stack's certificate.
		"--kubelet-certificate-authority="+e.PKI.CAFile, "--kubelet-preferred-address-types=InternalIP",
		"--v=0",
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	c.stopKube = func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	}
	t.Cleanup(func() {
		c.stopKube()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("kube-apiserver log (tail):\n%s", tail(string(b), 40))
		}
	})
	c.kubeURL = "https://" + addr
	for {
		if code, _ := c.call(ctx, c.kubeURL, e.Token, http.MethodGet, "/readyz", ""); code == http.StatusOK {
			break
		}
		select {
		case <-exited:
			t.Fatal("kube-apiserver exited before becoming ready")
		case <-ctx.Done():
			t.Fatal("kube-apiserver not ready")
		case <-time.After(250 * time.Millisecond):
		}
	}

	for user, tok := range map[string]string{"admin": e.Token, "alice": tokAlice, "node-1": tokNode1, "herald": tokHerald} {
		c.kubeCfg[user] = c.writeKubeconfig(user+"-direct", c.kubeURL, tok)
		c.heraldCfg[user] = c.writeKubeconfig(user+"-herald", e.FrontdoorURL, tok)
	}
	// The operator grants Herald what deploy/k8s/overlays/cluster grants it,
	// then points frontdoor at the cluster.
	root, _ := stack.RepoRoot()
	c.kubectlAs(t, ctx, c.kubeCfg["admin"], "apply", "-f", filepath.Join(root, "deploy/k8s/overlays/cluster/upstream-rbac.yaml"))
	c.kubectlAs(t, ctx, c.kubeCfg["admin"], "create", "clusterrolebinding", "herald-test-upstream", "--clusterrole=herald-upstream", "--user=herald")
	// In cluster mode identities are the cluster's only: the stack's static
	// token file goes (its admin token is known to kube-apiserver, and is
	// reviewed there like any other).
	fd := e.Proc("frontdoor-0")
	var args []string
	for _, a := range fd.Args {
		if !strings.HasPrefix(a, "--token-auth-file=") {
			args = append(args, a)
		}
	}
	fd.Args = append(append(args, "--upstream.kubeconfig="+c.kubeCfg["herald"], "--client-ca-file="+e.PKI.CAFile), o.frontdoorFlags...)
	if err := fd.Restart(false); err != nil {
		t.Fatal(err)
	}
	if err := fd.WaitReady(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	return c
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func (c *clusterEnv) writeKubeconfig(name, server, token string) string {
	p := filepath.Join(c.dir, name+".kubeconfig")
	os.WriteFile(p, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: %q, certificate-authority: %q}
users:
- name: u
  user: {token: %q}
contexts:
- name: c
  context: {cluster: c, user: u}
current-context: c
`, server, c.PKI.CAFile, token)), 0o600)
	return p
}

// kubectlAs runs kubectl with kubeconfig and fails the test on an error.
func (c *clusterEnv) kubectlAs(t *testing.T, ctx context.Context, kubeconfig string, args ...string) string {
	t.Helper()
	out, err := c.kubectlTry(ctx, kubeconfig, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (c *clusterEnv) kubectlTry(ctx context.Context, kubeconfig string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.kubectl, append([]string{"--kubeconfig", kubeconfig, "--cache-dir", filepath.Join(c.dir, "kubectl-cache", filepath.Base(kubeconfig))}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// call sends one request with a bearer token and returns the code and body.
func (c *clusterEnv) call(ctx context.Context, base, token, method, path, body string) (int, string) {
	code, b, _ := c.callHeader(ctx, base, token, method, path, body, nil)
	return code, b
}

// callHeader is call with the request's extra headers hdr, returning the
// answer's headers too.
func (c *clusterEnv) callHeader(ctx context.Context, base, token, method, path, body string, hdr map[string]string) (int, string, http.Header) {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.PKI.CAPEM)
	cl := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 30 * time.Second}
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequestWithContext(ctx, method, base+path, rd)
	req.Header.Set("Authorization", "Bearer "+token)
	if method == http.MethodPatch {
		req.Header.Set("Content-Type", "application/merge-patch+json")
	} else if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := cl.Do(req)
	if err != nil {
		return 0, err.Error(), nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// status is a Status body's code, reason and message.
func statusLine(body string) string {
	var st objMeta
	if json.Unmarshal([]byte(body), &st) != nil || st.Kind != "Status" {
		return ""
	}
	return fmt.Sprintf("%d %s: %s", st.Code, st.Reason, st.Message)
}

const demoManifests = `
apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: v1
kind: Namespace
metadata: {name: other}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: default, namespace: demo}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: demo, labels: {app: web}}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: registry.k8s.io/pause:3.10}]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: demo}
data: {color: blue}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: configmaps, namespace: demo}
rules:
- {apiGroups: [""], resources: [configmaps], verbs: [get, list, watch, create, update, patch, delete]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: alice-configmaps, namespace: demo}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: configmaps}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}]
`

// constrainedManifests let alice impersonate bob to list ConfigMaps, and
// nothing else (constrained impersonation's verbs), and bob use the demo
// namespace's ConfigMaps.
const constrainedManifests = `
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: impersonate-bob-to-list-configmaps}
rules:
- {apiGroups: [authentication.k8s.io], resources: [users], resourceNames: [bob], verbs: ["impersonate:user-info"]}
- {apiGroups: [""], resources: [configmaps], verbs: ["impersonate-on:user-info:list"]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: alice-impersonates-bob}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: impersonate-bob-to-list-configmaps}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bob-configmaps, namespace: demo}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: configmaps}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: bob}]
`

// TestClusterMode: Herald as a drop-in front for kube-apiserver.
func TestClusterMode(t *testing.T) {
	c := startCluster(t)
	longStreams := startLongStreams(t, c) // runs while the other subtests do
	ctx := testContext(t, 5*time.Minute+longStreamDuration(t))
	admin := c.heraldCfg["admin"]
	manifests := filepath.Join(c.dir, "demo.yaml")
	os.WriteFile(manifests, []byte(demoManifests), 0o600)

	// Writes pass through as the caller; kube-apiserver stores them.
	t.Run("apply", func(t *testing.T) {
		out := c.kubectlAs(t, ctx, admin, "apply", "-f", manifests)
		for _, want := range []string{"deployment.apps/web created", "service/web created", "configmap/settings created", "rolebinding.rbac.authorization.k8s.io/alice-configmaps created"} {
			if !strings.Contains(out, want) {
				t.Errorf("apply: no %q in\n%s", want, out)
			}
		}
		if code, body := c.call(ctx, c.kubeURL, c.Token, http.MethodGet, "/api/v1/namespaces/demo/configmaps/settings", ""); code != 200 || !strings.Contains(body, `"color":"blue"`) {
			t.Errorf("kube-apiserver does not hold the ConfigMap applied through Herald: %d %s", code, body)
		}
	})
	// Applying again reads the objects (from Herald's cache) and finds
	// nothing to change.
	t.Run("apply-again", func(t *testing.T) {
		out := c.kubectlAs(t, ctx, admin, "apply", "-f", manifests)
		if !strings.Contains(out, "configmap/settings unchanged") {
			t.Errorf("second apply:\n%s", out)
		}
	})

	t.Run("patch-scale-label-delete", func(t *testing.T) {
		c.kubectlAs(t, ctx, admin, "-n", "demo", "patch", "configmap", "settings", "--type=merge", "-p", `{"data":{"size":"xl"}}`)
		c.kubectlAs(t, ctx, admin, "-n", "demo", "scale", "deployment", "web", "--replicas=3")
		c.kubectlAs(t, ctx, admin, "-n", "demo", "label", "service", "web", "tier=front")
		_, body := c.call(ctx, c.kubeURL, c.Token, http.MethodGet, "/apis/apps/v1/namespaces/demo/deployments/web", "")
		if !strings.Contains(body, `"replicas":3`) {
			t.Errorf("scale did not reach kube-apiserver: %s", clip(body))
		}
		if out := c.kubectlAs(t, ctx, admin, "-n", "demo", "get", "deployment", "web", "-o", "jsonpath={.spec.replicas}"); out != "3" {
			t.Errorf("Herald serves replicas %q after the scale, want 3", out)
		}
		if out := c.kubectlAs(t, ctx, admin, "-n", "demo", "get", "service", "web", "-o", "jsonpath={.metadata.labels.tier}"); out != "front" {
			t.Errorf("Herald serves label tier=%q after the label, want front", out)
		}
		c.kubectlAs(t, ctx, admin, "-n", "demo", "create", "configmap", "doomed", "--from-literal=a=b")
		c.kubectlAs(t, ctx, admin, "-n", "demo", "delete", "configmap", "doomed")
		if code, _ := c.call(ctx, c.kubeURL, c.Token, http.MethodGet, "/api/v1/namespaces/demo/configmaps/doomed", ""); code != 404 {
			t.Errorf("deleted ConfigMap: kube-apiserver answers %d", code)
		}
	})

	// A client that writes through Herald and reads back without a
	// resourceVersion sees its write.
	t.Run("read-your-writes", func(t *testing.T) {
		for i := range 5 {
			name := fmt.Sprintf("ryw-%d", i)
			code, body := c.call(ctx, c.FrontdoorURL, c.Token, http.MethodPost, "/api/v1/namespaces/demo/configmaps",
				fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":%q},"data":{"i":"%d"}}`, name, i))
			if code != http.StatusCreated {
				t.Fatalf("create %s: %d %s", name, code, body)
			}
			var created objMeta
			json.Unmarshal([]byte(body), &created)
			code, body = c.call(ctx, c.FrontdoorURL, c.Token, http.MethodGet, "/api/v1/namespaces/demo/configmaps/"+name, "")
			var got objMeta
			json.Unmarshal([]byte(body), &got)
			if code != 200 || got.Metadata.ResourceVersion != created.Metadata.ResourceVersion {
				t.Errorf("GET right after create: %d rv %q, want 200 rv %q: %s", code, got.Metadata.ResourceVersion, created.Metadata.ResourceVersion, clip(body))
			}
			code, body = c.call(ctx, c.FrontdoorURL, c.Token, http.MethodGet, "/api/v1/namespaces/demo/configmaps", "")
			if code != 200 || !strings.Contains(body, `"name":"`+name+`"`) {
				t.Errorf("LIST right after create misses %s: %d %s", name, code, clip(body))
			}
		}
	})

	// A list older than the cache's window is kube-apiserver's to answer
	// (it reads etcd, or its own watch cache): an exact list and a paged
	// list's next page get what kube-apiserver gives, not the cache's 410.
	t.Run("list-older-than-window", func(t *testing.T) {
		const base = "/api/v1/namespaces/demo/podtemplates"
		create := func(name string) {
			t.Helper()
			code, body := c.call(ctx, c.FrontdoorURL, c.Token, http.MethodPost, base,
				fmt.Sprintf(`{"apiVersion":"v1","kind":"PodTemplate","metadata":{"name":%q},"template":{"spec":{"containers":[{"name":"c","image":"i"}]}}}`, name))
			if code != http.StatusCreated {
				t.Fatalf("create %s: %d %s", name, code, clip(body))
			}
		}
		create("a-0")
		create("a-1")
		var first podList
		if code := c.get(t, base+"?limit=1", &first); code != http.StatusOK || first.Metadata.Continue == "" {
			t.Fatalf("first page: %d %+v", code, first.Metadata)
		}
		for i := range 5 {
			create(fmt.Sprintf("b-%d", i))
		}
		// The cache has applied them (a list reads its latest state):
		// the first page's revision is out of its window now.
		var now podList
		if code := c.get(t, base, &now); code != http.StatusOK || len(now.Items) != 7 {
			t.Fatalf("list: %d, %d items, want 7", code, len(now.Items))
		}
		names := func(l podList) string {
			var out []string
			for _, it := range l.Items {
				var m objMeta
				json.Unmarshal(it, &m)
				out = append(out, m.Metadata.Name)
			}
			return strings.Join(out, ",")
		}
		forwarded := metricLabeled(t, c.Proc("frontdoor-0"), "herald_frontdoor_lists_older_than_window_total", `resource="podtemplates"`)
		for _, path := range []string{
			base + "?resourceVersionMatch=Exact&resourceVersion=" + first.Metadata.ResourceVersion,
			base + "?limit=1&continue=" + url.QueryEscape(first.Metadata.Continue),
		} {
			hc, hb := c.call(ctx, c.FrontdoorURL, c.Token, http.MethodGet, path, "")
			kc, kb := c.call(ctx, c.kubeURL, c.Token, http.MethodGet, path, "")
			var h, k podList
			json.Unmarshal([]byte(hb), &h)
			json.Unmarshal([]byte(kb), &k)
			if hc != http.StatusOK || hc != kc || h.Metadata != k.Metadata || names(h) != names(k) {
				t.Errorf("%s:\nHerald         %d %s\nkube-apiserver %d %s", path, hc, clip(hb), kc, clip(kb))
			}
		}
		if n := metricLabeled(t, c.Proc("frontdoor-0"), "herald_frontdoor_lists_older_than_window_total", `resource="podtemplates"`) - forwarded; n != 2 {
			t.Errorf("lists forwarded as older than the window: %v, want 2", n)
		}
	})

	// Every answer carries the request's audit ID once, as kube-apiserver's
	// do: one served from the cache, and one kube-apiserver gave (which
	// echoes the ID frontdoor forwarded; that it was forwarded is
	// TestAuditID's, in frontdoor's unit tests).
	t.Run("audit-id", func(t *testing.T) {
		for _, tc := range []struct {
			method, body string
			code         int
		}{
			{http.MethodGet, "", http.StatusOK},
			{http.MethodPost, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"audit-id"}}`, http.StatusCreated},
		} {
			code, body, h := c.callHeader(ctx, c.FrontdoorURL, c.Token, tc.method, "/api/v1/namespaces/demo/configmaps", tc.body,
				map[string]string{"Audit-ID": "e2e-" + tc.method})
			if got := h.Values("Audit-Id"); code != tc.code || len(got) != 1 || got[0] != "e2e-"+tc.method {
				t.Errorf("%s: %d, Audit-Id %q; want %d and the client's ID once: %s", tc.method, code, got, tc.code, clip(body))
			}
			if got := h.Values("Cache-Control"); len(got) != 1 || got[0] != "no-cache, private" {
				t.Errorf("%s: Cache-Control %q, want kube-apiserver's once", tc.method, got)
			}
		}
	})

	// kubectl's discovery, can-i and explain answer as kube-apiserver's.
	t.Run("discovery-can-i-explain", func(t *testing.T) {
		for _, args := range [][]string{
			{"api-resources"},
			{"api-versions"},
			{"explain", "deployment.spec.replicas"},
			{"auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"},
		} {
			direct := c.kubectlAs(t, ctx, c.kubeCfg["alice"], args...)
			via := c.kubectlAs(t, ctx, c.heraldCfg["alice"], args...)
			if direct != via {
				t.Errorf("kubectl %s: Herald\n%s\nkube-apiserver\n%s", strings.Join(args, " "), clip(via), clip(direct))
			}
		}
		for _, q := range [][]string{
			{"list", "configmaps", "-n", "demo"}, {"list", "configmaps", "-n", "other"}, {"create", "configmaps", "-n", "demo"},
			{"list", "secrets", "-n", "demo"}, {"list", "configmaps", "-A"}, {"--list", "-n", "demo"},
		} {
			args := append([]string{"auth", "can-i"}, q...)
			direct, _ := c.kubectlTry(ctx, c.kubeCfg["alice"], args...)
			via, _ := c.kubectlTry(ctx, c.heraldCfg["alice"], args...)
			if direct != via {
				t.Errorf("kubectl %s: Herald %q, kube-apiserver %q", strings.Join(args, " "), via, direct)
			}
		}
	})

	// A user with a namespaced Role gets 403 from Herald exactly where
	// kube-apiserver gives it, reads (served by Herald) and writes alike.
	t.Run("namespaced-role", func(t *testing.T) {
		cm := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"alice-%s"}}`
		for _, r := range []struct{ method, path, body string }{
			{http.MethodGet, "/api/v1/namespaces/demo/configmaps", ""},
			{http.MethodGet, "/api/v1/namespaces/demo/configmaps/settings", ""},
			{http.MethodGet, "/api/v1/namespaces/other/configmaps", ""},
			{http.MethodGet, "/api/v1/configmaps", ""},
			{http.MethodGet, "/api/v1/namespaces/demo/secrets", ""},
			{http.MethodGet, "/api/v1/namespaces/demo/pods", ""},
			{http.MethodGet, "/api/v1/namespaces/demo/configmaps?watch=true&timeoutSeconds=1", ""},
			{http.MethodGet, "/api/v1/configmaps?watch=true&timeoutSeconds=1", ""},
			{http.MethodPost, "/api/v1/namespaces/other/configmaps", fmt.Sprintf(cm, "other")},
			{http.MethodDelete, "/api/v1/namespaces/other/configmaps/x", ""},
			{http.MethodGet, "/apis/apps/v1/namespaces/demo/deployments/web/scale", ""},
		} {
			kc, kb := c.call(ctx, c.kubeURL, tokAlice, r.method, r.path, r.body)
			hc, hb := c.call(ctx, c.FrontdoorURL, tokAlice, r.method, r.path, r.body)
			if kc != hc || (kc == http.StatusForbidden && statusLine(kb) != statusLine(hb)) {
				t.Errorf("alice %s %s: Herald %d %s, kube-apiserver %d %s", r.method, r.path, hc, statusLine(hb), kc, statusLine(kb))
			}
		}
	})

	// A deprecated API version's reads carry kube-apiserver's Warning,
	// judged at kube-apiserver's version (this build's v0.0.0 deprecates
	// every version that has a deprecation release, as it does there).
	t.Run("deprecation-warning", func(t *testing.T) {
		for _, args := range [][]string{{"-n", "demo", "get", "endpoints"}, {"get", "endpoints", "-A", "-o", "name"}, {"-n", "demo", "get", "configmaps", "-o", "name"}} {
			direct := c.kubectlAs(t, ctx, c.kubeCfg["admin"], args...)
			via := c.kubectlAs(t, ctx, admin, args...)
			if direct != via {
				t.Errorf("kubectl %s: Herald\n%s\nkube-apiserver\n%s", strings.Join(args, " "), via, direct)
			}
			if slices.Contains(args, "endpoints") != strings.Contains(via, "Warning: v1 Endpoints is deprecated") {
				t.Errorf("kubectl %s through Herald: %q", strings.Join(args, " "), via)
			}
		}
	})

	// kubectl --as: the impersonation is the cluster's to authorize.
	t.Run("as", func(t *testing.T) {
		if out := c.kubectlAs(t, ctx, admin, "--as", "alice", "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"); out != "alice" {
			t.Errorf("admin --as alice: whoami %q", out)
		}
		for _, kc := range []string{c.kubeCfg["admin"], admin} {
			out, err := c.kubectlTry(ctx, kc, "--as", "alice", "-n", "other", "get", "configmaps")
			if err == nil || !strings.Contains(out, `User "alice" cannot list resource "configmaps"`) {
				t.Errorf("admin --as alice lists configmaps in other (%s): %v %s", kc, err, out)
			}
		}
		if out := c.kubectlAs(t, ctx, admin, "--as", "alice", "-n", "demo", "get", "configmap", "settings", "-o", "jsonpath={.data.color}"); out != "blue" {
			t.Errorf("admin --as alice reads settings: %q", out)
		}
		// Refused as kube-apiserver refuses it (v1.36+: constrained
		// impersonation names the first check that failed).
		for _, args := range [][]string{
			{"--as", "herald-admin", "-n", "demo", "get", "configmaps"},
			{"--as", "herald-admin", "-n", "demo", "create", "configmap", "escalated"},
		} {
			direct, derr := c.kubectlTry(ctx, c.kubeCfg["alice"], args...)
			via, err := c.kubectlTry(ctx, c.heraldCfg["alice"], args...)
			if err == nil || derr == nil || via != direct || !strings.Contains(via, "cannot impersonate") {
				t.Errorf("alice %s (not allowed to impersonate): Herald %v %q, kube-apiserver %v %q", strings.Join(args, " "), err, via, derr, direct)
			}
		}
	})

	// Constrained impersonation (KEP-5284, on by default since v1.36):
	// alice may act as bob only to list ConfigMaps; bob's own rights
	// then apply.
	t.Run("as-constrained", func(t *testing.T) {
		grant := filepath.Join(c.dir, "constrained.yaml")
		os.WriteFile(grant, []byte(constrainedManifests), 0o600)
		c.kubectlAs(t, ctx, admin, "apply", "-f", grant)
		list := []string{"--as", "bob", "-n", "demo", "get", "configmaps", "-o", "name"}
		// kube-apiserver's RBAC follows the new bindings through its
		// informers, and Herald asks again once its cached refusal (the
		// "as" case asked the same) is older than the deny TTL (10 s):
		// wait until each allows it.
		for _, kc := range []string{c.kubeCfg["alice"], c.heraldCfg["alice"]} {
			deadline := time.Now().Add(15 * time.Second)
			for {
				out, err := c.kubectlTry(ctx, kc, list...)
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("alice --as bob lists configmaps (%s): still %v %q 15 s after the grant", kc, err, out)
				}
				time.Sleep(200 * time.Millisecond) // polling the grant's effect, bounded by the deadline
			}
		}
		for _, args := range [][]string{
			list,
			{"--as", "bob", "-n", "demo", "get", "configmap", "settings"},
			{"--as", "bob", "-n", "other", "get", "configmaps"},
			{"--as", "bob", "-n", "demo", "create", "configmap", "as-bob"},
		} {
			direct, derr := c.kubectlTry(ctx, c.kubeCfg["alice"], args...)
			via, err := c.kubectlTry(ctx, c.heraldCfg["alice"], args...)
			if via != direct || (err == nil) != (derr == nil) {
				t.Errorf("alice %s: Herald %v %q, kube-apiserver %v %q", strings.Join(args, " "), err, via, derr, direct)
			}
		}
		if out, _ := c.kubectlTry(ctx, c.heraldCfg["alice"], list...); !strings.Contains(out, "configmap/settings") {
			t.Errorf("alice --as bob lists configmaps through Herald: %q", out)
		}
	})

	// An RBAC change made through Herald takes effect, for the reads Herald
	// serves, within the authorization cache's TTL (10 s by default).
	t.Run("rbac-change", func(t *testing.T) {
		const path = "/api/v1/namespaces/demo/pods"
		if code, body := c.call(ctx, c.FrontdoorURL, tokAlice, http.MethodGet, path, ""); code != http.StatusForbidden {
			t.Fatalf("alice lists pods before the grant: %d %s", code, clip(body))
		}
		c.kubectlAs(t, ctx, admin, "-n", "demo", "create", "role", "pods", "--verb=list", "--resource=pods")
		c.kubectlAs(t, ctx, admin, "-n", "demo", "create", "rolebinding", "alice-pods", "--role=pods", "--user=alice")
		granted := time.Now()
		waitCode(t, ctx, c, tokAlice, path, http.StatusOK, granted, 15*time.Second)
		c.kubectlAs(t, ctx, admin, "-n", "demo", "delete", "rolebinding", "alice-pods")
		waitCode(t, ctx, c, tokAlice, path, http.StatusForbidden, time.Now(), 15*time.Second)
	})

	// The Node authorizer: a node reads only the Secrets its pods reference.
	t.Run("node-authorizer", func(t *testing.T) {
		for _, s := range []string{"used", "unused"} {
			code, body := c.call(ctx, c.FrontdoorURL, c.Token, http.MethodPost, "/api/v1/namespaces/demo/secrets",
				fmt.Sprintf(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":%q},"stringData":{"k":"v"}}`, s))
			if code != http.StatusCreated {
				t.Fatalf("create secret %s: %d %s", s, code, body)
			}
		}
		code, body := c.call(ctx, c.FrontdoorURL, c.Token, http.MethodPost, "/api/v1/namespaces/demo/pods",
			`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"on-node-1"},"spec":{"nodeName":"node-1","automountServiceAccountToken":false,
			"containers":[{"name":"c","image":"registry.k8s.io/pause:3.10"}],"volumes":[{"name":"s","secret":{"secretName":"used"}}]}}`)
		if code != http.StatusCreated {
			t.Fatalf("create pod: %d %s", code, body)
		}
		const unused = "/api/v1/namespaces/demo/secrets/unused"
		kc, kb := c.call(ctx, c.kubeURL, tokNode1, http.MethodGet, unused, "")
		hc, hb := c.call(ctx, c.FrontdoorURL, tokNode1, http.MethodGet, unused, "")
		if kc != http.StatusForbidden || hc != http.StatusForbidden || statusLine(kb) != statusLine(hb) {
			t.Errorf("node-1 reads an unreferenced Secret: Herald %d %s, kube-apiserver %d %s", hc, statusLine(hb), kc, statusLine(kb))
		}
		// The referenced one: allowed once the Node authorizer's graph has
		// the pod (it follows the cluster's watch).
		waitCode(t, ctx, c, tokNode1, "/api/v1/namespaces/demo/secrets/used", http.StatusOK, time.Now(), 15*time.Second)
		if code, body := c.call(ctx, c.FrontdoorURL, tokNode1, http.MethodGet, "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1", ""); code != 200 {
			t.Errorf("node-1 lists its pods: %d %s", code, clip(body))
		}
		if code, body := c.call(ctx, c.FrontdoorURL, tokNode1, http.MethodGet, "/api/v1/pods", ""); code != 403 {
			t.Errorf("node-1 lists every pod: %d %s", code, clip(body))
		}
	})

	t.Run("kubelet-named-reads", func(t *testing.T) { testKubeletNamedReads(t, ctx, c) })

	// A watch of a resource Herald does not cache streams through from
	// kube-apiserver as it happens (chunked, flushed per event).
	t.Run("watch-passthrough", func(t *testing.T) {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(wctx, http.MethodGet, c.FrontdoorURL+"/api/v1/namespaces/demo/secrets?watch=true&resourceVersion=0", nil)
		req.Header.Set("Authorization", "Bearer "+c.Token)
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(c.PKI.CAPEM)
		resp, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("watch secrets: %d %s", resp.StatusCode, b)
		}
		events := make(chan watchEvent, 100)
		go func() {
			defer close(events)
			dec := json.NewDecoder(resp.Body)
			for {
				var ev watchEvent
				if dec.Decode(&ev) != nil {
					return
				}
				events <- ev
			}
		}()
		code, body := c.call(ctx, c.FrontdoorURL, c.Token, http.MethodPost, "/api/v1/namespaces/demo/secrets", `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"streamed"}}`)
		if code != http.StatusCreated {
			t.Fatalf("create secret: %d %s", code, body)
		}
		for ev := range events {
			if ev.Type == "ADDED" && ev.meta().Metadata.Name == "streamed" {
				return
			}
		}
		t.Error("the watch through Herald never delivered the new Secret")
	})

	// An upgrade the upstream refuses (no kubelet runs node-1) gets the
	// upstream's own answer.
	t.Run("exec-refused", func(t *testing.T) {
		args := []string{"-n", "demo", "exec", "on-node-1", "--", "true"}
		direct, derr := c.kubectlTry(ctx, c.kubeCfg["admin"], args...)
		via, herr := c.kubectlTry(ctx, admin, args...)
		if derr == nil || herr == nil || direct != via {
			t.Errorf("kubectl exec: Herald %v %q, kube-apiserver %v %q", herr, via, derr, direct)
		}
	})

	t.Run("crd-custom-resource", func(t *testing.T) { testCustomResources(t, ctx, c) })
	t.Run("crd-deprecated-version", func(t *testing.T) { testDeprecatedCustomResource(t, ctx, c) })
	t.Run("controller", func(t *testing.T) { testController(t, ctx, c) })
	t.Run("streaming", func(t *testing.T) { testStreaming(t, ctx, c) })
	t.Run("bound-token", func(t *testing.T) { testBoundToken(t, ctx, c) })
	t.Run("local-identities-refused", func(t *testing.T) { testLocalIdentitiesRefused(t, ctx, c) })
	t.Run("make-run-cluster-mode", func(t *testing.T) { testMakeRunClusterMode(t, ctx, c) })

	t.Run("forwarded-identity", func(t *testing.T) { testForwardedIdentity(t, ctx, c) })
	t.Run("long-streams", longStreams) // its own deadline: past five minutes

	// Bodies over kube-apiserver's limit are refused before forwarding.
	t.Run("body-limit", func(t *testing.T) {
		big := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"big"},"data":{"x":%q}}`, strings.Repeat("x", 4<<20))
		code, body := c.call(ctx, c.FrontdoorURL, c.Token, http.MethodPost, "/api/v1/namespaces/demo/configmaps", big)
		if code != http.StatusRequestEntityTooLarge {
			t.Errorf("4 MiB body: %d %s", code, clip(body))
		}
	})

	// Last: the upstream goes away; clients get a 503 Status at once.
	t.Run("upstream-down", func(t *testing.T) {
		c.stopKube()
		start := time.Now()
		code, body := c.call(ctx, c.FrontdoorURL, c.Token, http.MethodPost, "/api/v1/namespaces/demo/configmaps", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"late"}}`)
		if code != http.StatusServiceUnavailable || !strings.HasPrefix(statusLine(body), "503 ServiceUnavailable") {
			t.Errorf("write with the upstream down: %d %s", code, body)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("the 503 took %s", d)
		}
	})
}

// waitCode polls path as token until it answers want, failing after
// within (from since).
func waitCode(t *testing.T, ctx context.Context, c *clusterEnv, token, path string, want int, since time.Time, within time.Duration) {
	t.Helper()
	for {
		code, body := c.call(ctx, c.FrontdoorURL, token, http.MethodGet, path, "")
		if code == want {
			t.Logf("%s answered %d after %s", path, want, time.Since(since).Round(100*time.Millisecond))
			return
		}
		if time.Since(since) > within {
			t.Errorf("%s: still %d after %s, want %d: %s", path, code, within, want, clip(body))
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func clip(s string) string {
	if len(s) > 400 {
		return s[:400] + "…(" + strconv.Itoa(len(s)) + " bytes)"
	}
	return s
}

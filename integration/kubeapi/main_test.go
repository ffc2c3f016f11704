// Package kubeapi is the end-to-end test of Herald against a real
// kube-apiserver (issue 14, acceptance 1 and 2): kube-apiserver v1.37.2 and
// Herald run on the same etcd, objects of every kind are written through
// kube-apiserver with client-go, and every read Herald serves is compared
// with kube-apiserver's answer to the same request.
//
// One kube-apiserver and one Herald stack serve every test of the package
// (started by the first test that needs them, stopped by TestMain). The
// tests never write through Herald and never write etcd directly: what is in
// etcd is exactly what kube-apiserver stored (protobuf values, Secrets
// encrypted with aescbc).
//
// What is compared, and why exactly that:
//   - Objects (GET, every list item, every watch event) as bytes for JSON
//     and PartialObjectMetadata, as semantically equal decoded objects for
//     protobuf, and Tables as bytes (columns, cells, row objects).
//   - A list's metadata.resourceVersion: both servers answer a list without
//     resourceVersion as a consistent read, so each answers with a revision
//     at least etcd's revision when the request arrived. The test asks
//     kube-apiserver, then Herald, then kube-apiserver again; Herald's
//     revision must lie between the two. The items of the three answers
//     are compared only when kube-apiserver's two answers are identical (the
//     resource did not change in between); otherwise the triple is retried.
//   - continue tokens: presence, and the pages they lead to; not their bytes
//     (they embed each server's own revision).
//   - Errors: HTTP status, the Status object's code and reason; the message
//     in its own subtest.
//
// kube-apiserver is built once from integration/bench/kubeapiserver and
// cached (stack.KubeAPIServerBinary; HERALD_KUBE_APISERVER names a prebuilt
// one). HERALD_KUBEAPI_SELFCHECK=1 points the Herald side of every
// comparison at kube-apiserver itself: everything must pass then, which
// shows that no comparison depends on timing.
package kubeapi

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"herald.dev/integration/stack"
)

// selfCheckEnv, when set, points the tests' "Herald" side at
// kube-apiserver itself: every check must then pass, which proves that the
// comparisons do not fail on time-dependent answers (ages, revisions).
const selfCheckEnv = "HERALD_KUBEAPI_SELFCHECK"

var (
	binDir  string
	kubeBin string
	shared  fixture
)

func TestMain(m *testing.M) {
	var err error
	if kubeBin, err = stack.KubeAPIServerBinary(os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stack.RunTests(runner{m}, &binDir)
}

// runner stops the shared fixture after the tests.
type runner struct{ m *testing.M }

func (r runner) Run() int {
	code := r.m.Run()
	shared.stop()
	return code
}

// fixture is the kube-apiserver and Herald shared by the package's tests,
// with the objects written through kube-apiserver.
type fixture struct {
	once sync.Once
	err  error

	dir       string
	stack     *stack.Stack
	kas       *stack.KubeAPIServer
	kubeURL   string
	heraldURL string
	http      *http.Client // trusts the dev CA, sends the admin token
	kubeCfg   *rest.Config
	heraldCfg *rest.Config
	dyn       dynamic.Interface // writes through kube-apiserver
	logs      *os.File

	// Written by setup.
	cases []*resourceCase
}

// env returns the shared fixture, starting it on first use.
func env(t *testing.T) *fixture {
	t.Helper()
	shared.once.Do(func() { shared.err = shared.start() })
	if shared.err != nil {
		t.Fatalf("starting kube-apiserver and Herald: %v", shared.err)
	}
	return &shared
}

func (f *fixture) start() error {
	dir, err := os.MkdirTemp("", "herald-kubeapi")
	if err != nil {
		return err
	}
	f.dir = dir
	if f.logs, err = os.Create(filepath.Join(dir, "services.log")); err != nil {
		return err
	}
	enc := filepath.Join(dir, "encryption.yaml")
	if err := writeEncryptionConfig(enc); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	f.stack, err = stack.Start(ctx, stack.Options{
		Dir: filepath.Join(dir, "herald"), BinDir: binDir, Logs: f.logs, Cluster: stack.ClusterEtcd{EncryptionConfig: enc},
	})
	if err != nil {
		return fmt.Errorf("herald: %w (logs: %s)", err, f.logs.Name())
	}
	s := f.stack
	f.http = s.HTTPClient()
	f.kas, err = stack.StartKubeAPIServer(ctx, stack.KubeAPIServerOptions{
		Bin: kubeBin, Dir: filepath.Join(dir, "kube-apiserver"), Etcd: s.EtcdEndpoint,
		CertFile: s.PKI.CertFile, KeyFile: s.PKI.KeyFile, TokenFile: s.TokenFile, AdminToken: s.Token,
		EncryptionConfig: enc, Authorization: "RBAC", Client: &http.Client{Transport: s.TLSTransport(), Timeout: 5 * time.Second},
	})
	if err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	f.kubeURL, f.heraldURL = f.kas.URL, s.FrontdoorURL
	if os.Getenv(selfCheckEnv) != "" {
		f.heraldURL = f.kubeURL
	}
	f.kubeCfg = f.restConfig(f.kubeURL)
	f.heraldCfg = f.restConfig(f.heraldURL)
	if f.dyn, err = dynamic.NewForConfig(f.kubeCfg); err != nil {
		return err
	}
	return f.setup(ctx)
}

func (f *fixture) restConfig(host string) *rest.Config {
	return &rest.Config{
		Host: host, BearerToken: f.stack.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: f.stack.PKI.CAPEM},
		QPS:             -1, // no client-side throttling: the test measures nothing
	}
}

func (f *fixture) stop() {
	if f.kas != nil {
		f.kas.Stop()
	}
	if f.stack != nil {
		f.stack.Stop()
	}
	if f.logs != nil {
		f.logs.Close()
	}
	if f.dir != "" && f.err == nil {
		os.RemoveAll(f.dir)
	}
}

// logTail is printed by a failing test: the end of Herald's and
// kube-apiserver's logs.
func (f *fixture) logTail(t *testing.T) {
	t.Helper()
	if !t.Failed() {
		return
	}
	if f.logs != nil {
		b, _ := os.ReadFile(f.logs.Name())
		t.Logf("Herald logs (tail):\n%s", tail(string(b), 40))
	}
	if f.kas != nil {
		b, _ := os.ReadFile(f.kas.Log())
		t.Logf("kube-apiserver log (tail):\n%s", tail(string(b), 20))
	}
}

func writeEncryptionConfig(path string) error {
	key := make([]byte, 32)
	rand.Read(key)
	cfg := fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources: [secrets]
  providers:
  - aescbc:
      keys:
      - name: key1
        secret: %s
  - identity: {}
`, base64.StdEncoding.EncodeToString(key))
	return os.WriteFile(path, []byte(cfg), 0o600)
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

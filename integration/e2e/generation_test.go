package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"herald.dev/integration/stack"
)

// TestAnotherEtcdSameStream is issue 54's first acceptance: `make run` on
// its embedded etcd (A), objects written, stopped; then cluster mode on
// another etcd (B, at a lower revision) in the same directory, so with the
// same NATS store and its stream of A's history. B's objects must be served
// within 30 s, and none of A's.
func TestAnotherEtcdSameStream(t *testing.T) {
	dir := t.TempDir()
	logs, err := os.Create(filepath.Join(t.TempDir(), "services.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	start := func(opts stack.Options) (*env, func()) {
		t.Helper()
		opts.Dir, opts.BinDir, opts.Logs = dir, binDir, logs
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		s, err := stack.Start(ctx, opts)
		if err != nil {
			b, _ := os.ReadFile(logs.Name())
			t.Fatalf("starting the stack: %v\n%s", err, tail(string(b), 60))
		}
		stop := sync.OnceFunc(s.Stop)
		t.Cleanup(stop)
		return &env{Stack: s, http: s.HTTPClient()}, stop
	}
	names := func(e *env) []string {
		var list struct {
			Items []struct {
				Metadata struct{ Namespace, Name string } `json:"metadata"`
			} `json:"items"`
		}
		if code := e.get(t, "/api/v1/pods", &list); code != 200 {
			return nil
		}
		var out []string
		for _, it := range list.Items {
			out = append(out, it.Metadata.Namespace+"/"+it.Metadata.Name)
		}
		slices.Sort(out)
		return out
	}
	waitFor := func(e *env, want []string, within time.Duration) time.Duration {
		t.Helper()
		began := time.Now()
		var got []string
		for time.Since(began) < within {
			if got = names(e); slices.Equal(got, want) {
				return time.Since(began)
			}
			time.Sleep(100 * time.Millisecond) // polling what frontdoor serves
		}
		t.Fatalf("after %v frontdoor serves pods %v, want %v", within, got, want)
		return 0
	}

	// The embedded etcd (A): the history the stream holds.
	a, stopA := start(stack.Options{})
	cliA := newEtcdClient(t, stack.ClusterEtcd{}, a.EtcdEndpoint)
	var wantA []string
	var aRev int64
	for i := range 10 {
		resp, err := cliA.Put(t.Context(), fmt.Sprintf("/registry/pods/ns-a/a-%d", i), podJSON("ns-a", fmt.Sprintf("a-%d", i), "n1", i))
		if err != nil {
			t.Fatal(err)
		}
		aRev = resp.Header.Revision
		wantA = append(wantA, fmt.Sprintf("ns-a/a-%d", i))
	}
	waitFor(a, wantA, 30*time.Second)
	stopA()

	// Another etcd (B), at a lower revision, with objects of its own.
	eb, bURL, err := stack.StartEtcd(t.TempDir(), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eb.Close)
	cliB := newEtcdClient(t, stack.ClusterEtcd{}, bURL)
	var wantB []string
	var bRev int64
	for i := range 3 {
		resp, err := cliB.Put(t.Context(), fmt.Sprintf("/registry/pods/ns-b/b-%d", i), podJSON("ns-b", fmt.Sprintf("b-%d", i), "n1", i))
		if err != nil {
			t.Fatal(err)
		}
		bRev = resp.Header.Revision
		wantB = append(wantB, fmt.Sprintf("ns-b/b-%d", i))
	}
	t.Logf("etcd A at revision %d, etcd B at %d", aRev, bRev)

	began := time.Now()
	b, _ := start(stack.Options{Cluster: stack.ClusterEtcd{Endpoints: bURL}})
	served := time.Since(began) + waitFor(b, wantB, 30*time.Second)
	t.Logf("etcd B's objects (and none of A's) served %v after the stack started on B", served.Round(time.Millisecond))
	if served > 30*time.Second {
		t.Errorf("B's objects served after %v, want within 30s", served)
	}

	// Watches from A's resourceVersions expire; B's next change reaches a
	// watch from B's list.
	code, body := b.getRaw(t, fmt.Sprintf("/api/v1/pods?watch=1&resourceVersion=%d&timeoutSeconds=2", aRev))
	if code != 200 || !strings.Contains(body, `"type":"ERROR"`) || !strings.Contains(body, `"code":410`) {
		t.Errorf("watch from etcd A's revision %d: %d %s, want an ERROR event with 410", aRev, code, tail(body, 3))
	}
	if _, err := cliB.Put(t.Context(), "/registry/pods/ns-b/b-next", podJSON("ns-b", "b-next", "n1", 0), clientv3.WithPrevKV()); err != nil {
		t.Fatal(err)
	}
	waitFor(b, append(wantB, "ns-b/b-next"), 10*time.Second)
}

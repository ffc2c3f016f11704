package loadgen

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"herald.dev/integration/stack"
)

// A slow etcd is offered the same writes as a fast one: WriteFor does not
// wait for one commit before the next slot's Put, so a server that slows
// etcd down on a saturated machine is not offered fewer events (the writes
// a workload owes are the same on both systems).
func TestWriteForKeepsPutsInFlightWhileCommitsAreSlow(t *testing.T) {
	e, endpoint, err := stack.StartEtcd(t.TempDir(), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	const commit = 100 * time.Millisecond
	var (
		mu                  sync.Mutex
		inFlight, maxFlight int
	)
	slowPuts := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if !strings.HasSuffix(method, "/Put") {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		mu.Lock()
		inFlight++
		maxFlight = max(maxFlight, inFlight)
		mu.Unlock()
		defer func() {
			mu.Lock()
			inFlight--
			mu.Unlock()
		}()
		time.Sleep(commit) // the slow commit (fault injection)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(slowPuts)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })

	const perSec = 200 // a slot every 5 ms: 20 commits of 100 ms overlap
	p := NewPods(50, 5)
	writes, err := p.WriteFor(context.Background(), cli, perSec, 500*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(writes) != 100 {
		t.Fatalf("%d writes, want 100", len(writes))
	}
	revs := map[int64]bool{}
	for _, w := range writes {
		if revs[w.Rev] {
			t.Fatalf("revision %d returned twice", w.Rev)
		}
		revs[w.Rev] = true
	}
	if maxFlight < 10 {
		t.Fatalf("at most %d Puts in flight with %v commits at %d/s, want at least 10 (a writer that waits for its commits offers less)", maxFlight, commit, perSec)
	}
}

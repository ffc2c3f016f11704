package frontdoor

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"herald.dev/services/frontdoor/internal/limits"
)

// TestWatchLimitsFitADaemonSet: with the default flags, 5,000 watches of one
// user (a DaemonSet's pods share its ServiceAccount) all open; other users
// still get watches while it holds them, and once the pool is contended it
// is the user holding the most who is refused, never one who holds little.
func TestWatchLimitsFitADaemonSet(t *testing.T) {
	s, _ := testServer(t, "", nil)
	const ds = "system:serviceaccount:kube-system:kube-proxy"
	for i := range 5000 {
		if _, refused := s.watches.Acquire(ds); refused != "" {
			t.Fatalf("DaemonSet watch %d refused with the default flags: %s", i, refused)
		}
	}
	if _, refused := s.watches.Acquire("alice"); refused != "" {
		t.Fatalf("another user while the DaemonSet holds 5,000 watches: %s", refused)
	}
	// Fill the pool with the DaemonSet's watches until it is refused: it is
	// refused for holding more than its share of a contended pool...
	held := 5000
	for {
		_, refused := s.watches.Acquire(ds)
		if refused != "" {
			if refused != limits.Fair {
				t.Fatalf("DaemonSet refused at %d watches for %q, want %q", held, refused, limits.Fair)
			}
			break
		}
		held++
	}
	if held < 3*s.cfg.MaxWatches/4-1 {
		t.Fatalf("DaemonSet refused at %d watches, before the pool (%d) was contended", held, s.cfg.MaxWatches)
	}
	// ...while the other users still open theirs.
	for _, u := range []string{"alice", "bob", "carol"} {
		if _, refused := s.watches.Acquire(u); refused != "" {
			t.Fatalf("%s refused while the DaemonSet holds %d: %s", u, held, refused)
		}
	}
}

// TestWatchInitializationHoldsARequestSlot: a watch holds a slot of the
// request pool (per user) until its fanout replica starts the stream, and
// then only its watch slot: a user's watches that are still initializing
// are paced by max-requests-inflight-per-user, its established ones are not.
func TestWatchInitializationHoldsARequestSlot(t *testing.T) {
	start := make(chan struct{})
	fan := newFanoutFake(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-start: // the replica takes its time to start the stream
		case <-r.Context().Done():
			return
		}
		w.WriteHeader(http.StatusOK)
		w.Write([]byte("{}\n"))
		w.(http.Flusher).Flush()
		<-r.Context().Done() // an established watch
	}))
	defer fan.Close()
	s, _ := testServer(t, fan.URL, func(c *Config) { c.MaxInflightPerUser = 1 })
	front := httptest.NewServer(s)
	defer front.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	watch := func() (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, front.URL+"/api/v1/namespaces/ns1/pods?watch=true", nil)
		req.Header.Set("Authorization", "Bearer "+tokAlice)
		return front.Client().Do(req)
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case <-ctx.Done():
				t.Fatalf("timed out waiting for %s (requests in use %d, watches in use %d)", what, s.requests.InUse(), s.watches.InUse())
			case <-time.After(5 * time.Millisecond): // polling a condition with a deadline
			}
		}
	}

	first := make(chan *http.Response, 1)
	go func() {
		resp, err := watch()
		if err != nil {
			t.Error(err)
		}
		first <- resp
	}()
	waitFor("the first watch to be initializing", func() bool { return s.requests.InUse() == 1 && s.watches.InUse() == 1 })
	resp, err := watch()
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("a second watch while alice's first initializes (per-user requests 1): %d, want 429", resp.StatusCode)
	}
	close(start)
	r1 := <-first
	if r1 == nil {
		t.FailNow()
	}
	defer r1.Body.Close()
	if line, err := bufio.NewReader(r1.Body).ReadString('\n'); r1.StatusCode != 200 || err != nil || line != "{}\n" {
		t.Fatalf("first watch: %d %q %v", r1.StatusCode, line, err)
	}
	waitFor("the established watch to hold only its watch slot", func() bool { return s.requests.InUse() == 0 && s.watches.InUse() == 1 })
	r2, err := watch()
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Body.Close()
	if r2.StatusCode != 200 {
		t.Fatalf("a second watch once the first is established: %d, want 200", r2.StatusCode)
	}
	waitFor("two established watches", func() bool { return s.requests.InUse() == 0 && s.watches.InUse() == 2 })
}

package frontdoor

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// TestFanoutRetry: a watch goes to a replica that is up; a refused
// connection or a 503 is retried on the next one, invisibly; neither the
// client's credential nor any header it sent reaches fanout.
func TestFanoutRetry(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + ln.Addr().String()
	ln.Close() // connection refused from now on
	busy := newFanoutFake(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer busy.Close()
	var got http.Header
	good := newFanoutFake(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		w.Write([]byte("{}\n"))
	}))
	defer good.Close()
	s, _ := testServer(t, strings.Join([]string{dead, busy.URL, good.URL}, ","), nil)
	for i := range 3 { // each replica goes first once
		req := httptest.NewRequest(http.MethodGet, "/api/v1/namespaces/ns1/pods?watch=true", nil)
		req.Header.Set("Authorization", "Bearer "+tokAlice)
		req.Header.Set("X-Remote-User", "admin")
		req.Header.Set("X-Remote-Group", "system:masters")
		req.Header.Set("Impersonate-User", "admin")
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != 200 || rec.Body.String() != "{}\n" {
			t.Fatalf("watch %d: %d %s", i, rec.Code, rec.Body)
		}
		if len(got) != 1 || got.Get("Accept") != "" {
			t.Fatalf("headers at fanout: %v, want only the client's Accept (none)", got)
		}
	}
	// With every replica failing, the client gets a 503 Status.
	s2, _ := testServer(t, dead, nil)
	code, body, h := do(s2, tokAlice, "/api/v1/namespaces/ns1/pods?watch=true")
	if c, reason, _ := statusOf(t, body); code != 503 || c != 503 || reason != "ServiceUnavailable" || h.Get("Retry-After") != "1" {
		t.Fatalf("no replica: %d %s", code, body)
	}
}

// TestWatchForwardedAsParsed: fanout receives a watch as frontdoor parsed
// it (a stream request: the selector's requirements, where it starts),
// whatever else or however the client spelled its options; a bad option
// never reaches a replica.
func TestWatchForwardedAsParsed(t *testing.T) {
	fan := newFanoutFake(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("{}\n"))
	}))
	defer fan.Close()
	s, _ := testServer(t, fan.URL, nil)
	code, body, _ := do(s, tokAlice, "/api/v1/namespaces/ns1/pods?watch=1&resourceVersion=7&allowWatchBookmarks=1&timeoutSeconds=030&limit=5&pretty=true&labelSelector=app%3Dweb")
	if code != 200 {
		t.Fatalf("watch: %d %s", code, body)
	}
	want := &heraldv1.WatchStreamRequest{Version: "v1", Resource: "pods", Namespace: "ns1",
		LabelRequirements: []*heraldv1.WatchStreamRequest_LabelRequirement{{Key: "app", Operator: "=", Values: []string{"web"}}},
		Start:             heraldv1.WatchStreamRequest_AFTER, Revision: 7, AllowWatchBookmarks: true, TimeoutSeconds: 30}
	got := fan.requests()
	if len(got) != 1 || !proto.Equal(got[0], want) {
		t.Fatalf("fanout got %v, want %v", got, want)
	}
	code, body, _ = do(s, tokAlice, "/api/v1/namespaces/ns1/pods?watch=1&resourceVersionMatch=NotOlderThan")
	if c, reason, _ := statusOf(t, body); code != 422 || c != 422 || reason != "Invalid" || len(fan.requests()) != 1 {
		t.Fatalf("invalid watch: %d %s (fanout asked %d times)", code, body, len(fan.requests()))
	}
}

// TestWatchEndsCleanlyWhenReplicaDies: a fanout replica that dies in the
// middle of a watch ends the client's watch as a server closing it would,
// not with an aborted stream: client-go resumes an ended watch from its
// resourceVersion but relists after an aborted one (a relist storm when a
// replica carrying thousands of informers dies).
func TestWatchEndsCleanlyWhenReplicaDies(t *testing.T) {
	testWatchEndsCleanlyWhenReplicaDies(t)
}

func testWatchEndsCleanlyWhenReplicaDies(t *testing.T) {
	const line = `{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a","namespace":"ns1","resourceVersion":"7"}}}` + "\n"
	fan := newFanoutFake(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(line))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the replica dies: its connection is cut
	}))
	defer fan.Close()
	s, _ := testServer(t, fan.URL, nil)
	front := httptest.NewServer(s)
	defer front.Close()
	req, _ := http.NewRequest(http.MethodGet, front.URL+"/api/v1/namespaces/ns1/pods?watch=true", nil)
	req.Header.Set("Authorization", "Bearer "+tokAlice)
	resp, err := front.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || err != nil || string(body) != line {
		t.Fatalf("watch through a dying replica: %d, %q, %v (want 200, the event, a clean end)", resp.StatusCode, body, err)
	}
	fan.servedAs(t)
}

// TestIdleWatchHoldsNoCopyBuffer: a watch borrows a copy buffer only while
// its replica's data flows; between events it holds none (an idle watch
// costs frontdoor no 32 KB), and every event still reaches the client at
// once, in order.
func TestIdleWatchHoldsNoCopyBuffer(t *testing.T) {
	next := make(chan string)
	fan := newFanoutFake(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for {
			select {
			case line := <-next:
				w.Write([]byte(line))
				w.(http.Flusher).Flush()
			case <-r.Context().Done():
				return
			}
		}
	}))
	defer fan.Close()
	s, _ := testServer(t, fan.URL, nil)
	front := httptest.NewServer(s)
	defer front.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, front.URL+"/api/v1/namespaces/ns1/pods?watch=true", nil)
	req.Header.Set("Authorization", "Bearer "+tokAlice)
	resp, err := front.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for i := range 3 {
		line := fmt.Sprintf(`{"type":"ADDED","object":{"metadata":{"resourceVersion":"%d"}}}`+"\n", i+1)
		next <- line
		got, err := br.ReadString('\n')
		if err != nil || got != line {
			t.Fatalf("event %d: %q, %v; want %q", i, got, err, line)
		}
		for s.fanout.buffers.lent.Load() != 0 {
			select {
			case <-ctx.Done():
				t.Fatalf("idle watch after event %d: %d copy buffers lent, want 0", i, s.fanout.buffers.lent.Load())
			case <-time.After(time.Millisecond): // polling a counter with a deadline
			}
		}
	}
}

// TestStreamContext: a watch's upstream context is done once cancelled
// (any number of times), with context.Canceled, has its parent's values,
// and ends what is derived from it, before and after it is cancelled (as
// the transport derives a context of it for each round trip).
func TestStreamContext(t *testing.T) {
	type key struct{}
	ctx := newStreamContext(context.WithValue(context.Background(), key{}, "trace"))
	if ctx.Value(key{}) != "trace" {
		t.Fatalf("value: %v, want the parent's", ctx.Value(key{}))
	}
	if _, ok := ctx.Deadline(); ok {
		t.Fatal("a deadline, want none")
	}
	child, cancelChild := context.WithCancelCause(ctx)
	ended, stop := context.WithCancel(ctx)
	defer stop()
	cancelChild(nil) // the transport ends its own once the response starts
	if err := ctx.Err(); err != nil {
		t.Fatalf("ended with its child: %v", err)
	}
	select {
	case <-ctx.Done():
		t.Fatal("done before cancel")
	default:
	}
	ctx.cancel()
	ctx.cancel()
	<-ctx.Done()
	if err := ctx.Err(); err != context.Canceled {
		t.Fatalf("Err: %v, want context.Canceled", err)
	}
	<-ended.Done() // derived before the cancel
	if err := ended.Err(); err != context.Canceled {
		t.Fatalf("derived context: %v, want context.Canceled", err)
	}
	late, stopLate := context.WithCancel(ctx)
	defer stopLate()
	if err := late.Err(); err != context.Canceled {
		t.Fatalf("context derived after the cancel: %v, want context.Canceled", err)
	}
	if err := child.Err(); err != context.Canceled {
		t.Fatalf("ended child: %v", err)
	}
}

// TestFanoutResponseTimeout: a replica that does not start its response
// within fanout.response-timeout has its request cancelled (it sees the
// request end) and the watch is retried on the next replica, invisibly.
func TestFanoutResponseTimeout(t *testing.T) {
	abandoned := make(chan struct{}, 2)
	stuck := newFanoutFake(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		abandoned <- struct{}{}
	}))
	defer stuck.Close()
	good := newFanoutFake(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("{}\n"))
	}))
	defer good.Close()
	s, _ := testServer(t, stuck.URL+","+good.URL, func(c *Config) {
		c.FanoutResponseTimeout = 200 * time.Millisecond
		c.FanoutRetryDown = time.Nanosecond // each replica goes first in turn
	})
	for i := range 2 { // each replica goes first once
		code, body, _ := do(s, tokAlice, "/api/v1/namespaces/ns1/pods?watch=true")
		if code != 200 || string(body) != "{}\n" {
			t.Fatalf("watch %d: %d %s", i, code, body)
		}
	}
	select {
	case <-abandoned:
	case <-time.After(10 * time.Second):
		t.Fatal("the stuck replica's request was not cancelled")
	}
}

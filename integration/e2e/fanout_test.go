package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"herald.dev/integration/checker"
	"herald.dev/integration/stack"
)

// bigPod is a pod of about size bytes.
func bigPod(ns, name string, gen, size int) string {
	b, _ := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "namespace": ns, "annotations": map[string]string{"blob": strings.Repeat("x", size)}},
		"spec":     map[string]any{"nodeName": "n"}, "status": map[string]any{"observedGeneration": gen},
	})
	return string(b)
}

// rawWatch reads a watch stream from url with a tiny socket receive buffer
// (a slow client), starting to read only when start is closed.
func rawWatch(t *testing.T, ctx context.Context, url string, start <-chan struct{}) <-chan watchEvent {
	return slowWatch(t, ctx, &http.Client{Transport: slowTransport(&http.Transport{DisableCompression: true})}, url, start)
}

// slowTransport is tr with a tiny socket receive buffer on every connection
// it dials (and HTTP/1.1: a connection per watch).
func slowTransport(tr *http.Transport) *http.Transport {
	dialer := &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		c.Control(func(fd uintptr) { err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return err
	}}
	tr.DialContext = dialer.DialContext
	tr.ForceAttemptHTTP2 = false
	return tr
}

// slowWatch reads a watch stream from url with client, starting to read
// only when start is closed.
func slowWatch(t *testing.T, ctx context.Context, client *http.Client, url string, start <-chan struct{}) <-chan watchEvent {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("slow watch: %d", resp.StatusCode)
	}
	ch := make(chan watchEvent, 100000)
	go func() {
		defer close(ch)
		defer resp.Body.Close()
		select {
		case <-start:
		case <-ctx.Done():
			return
		}
		sendEvents(resp.Body, ch)
	}()
	return ch
}

// sendEvents sends every line of a watch stream that decodes as an event;
// a line cut short by a server closing the stream is dropped.
func sendEvents(body io.Reader, ch chan<- watchEvent) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var ev watchEvent
		if json.Unmarshal(sc.Bytes(), &ev) == nil {
			ch <- ev
		}
	}
}

// TestSlowWatcherIsCutOff: a client that does not read is disconnected (its
// queue overflows, and the ring of recent events, 300 here, drops what it
// has not been sent) while 100 fast clients on the same replica receive every
// event; the slow client then drains what it had, resumes from its last
// resourceVersion and ends with every event exactly once.
func TestSlowWatcherIsCutOff(t *testing.T) {
	e := startStack(t, stack.Options{Flags: map[string][]string{"fanout": {"--watcher.queue-events=100", "--ring-size=300", "--max-watchers=1000"}}})
	ctx := testContext(t, 3*time.Minute)
	fanout := "http://" + e.Proc("fanout-0").Addrs["http"]
	from := e.rev(t, ctx)
	path := "/api/v1/namespaces/slow/pods?watch=true&resourceVersion=" + strconv.FormatInt(from, 10)

	fast := make([]<-chan watchEvent, 100)
	for i := range fast {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fanout+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("fast watch %d: %v", i, err)
		}
		ch := make(chan watchEvent, 10000)
		fast[i] = ch
		go func() {
			defer close(ch)
			defer resp.Body.Close()
			sendEvents(resp.Body, ch)
		}()
	}
	// The slow client watches every namespace: besides the fast clients'
	// events it gets 200 bulk events of 64 KiB (12.8 MiB), more than socket
	// buffers and its queue hold.
	startReading := make(chan struct{})
	slow := rawWatch(t, ctx, fanout+"/api/v1/pods?watch=true&resourceVersion="+strconv.FormatInt(from, 10), startReading)

	// 600 writes at 500/s: far more than the slow client's queue (100) and
	// socket buffers hold, at a pace 100 readers on this machine keep up with.
	var want []checker.WatchEvent
	pace := time.NewTicker(2 * time.Millisecond)
	defer pace.Stop()
	for i := range 600 {
		<-pace.C
		name := fmt.Sprintf("p%02d", i%40)
		want = append(want, e.put(t, ctx, "slow", name, bigPod("slow", name, i, 1024), i < 40))
		if i%3 == 0 {
			e.put(t, ctx, "bulk", name, bigPod("bulk", name, i, 64<<10), false)
		}
	}
	last := want[len(want)-1].RV
	for i, ch := range fast {
		got := collect(t, ctx, ch, last)
		if errs := checker.CheckWatch(want, got); len(errs) > 0 {
			t.Fatalf("fast client %d: %v", i, errs[0])
		}
	}
	// Every event has been written by now; the slow watcher overflowed long
	// before, though its cut may still be in flight to the metric.
	cut := func() float64 {
		return metricLabeled(t, e.Proc("fanout-0"), "apiserver_terminated_watchers_total", `reason="queue_full"`)
	}
	eventually(t, ctx, "the slow watcher is cut off", func() string {
		if n := cut(); n == 0 {
			return "no watcher terminated yet"
		}
		return ""
	})
	if n := cut(); n != 1 {
		t.Fatalf("%v watchers terminated, want exactly the slow one", n)
	}

	// The slow client drains what reached it, then resumes.
	history, err := checker.EtcdHistory(ctx, e.etcd, "/registry/pods/", from+1, e.rev(t, ctx))
	if err != nil {
		t.Fatal(err)
	}
	want = checker.ExpectedEvents("/registry/pods/", history, nil)
	last = want[len(want)-1].RV
	close(startReading)
	var got []checker.WatchEvent
	for ev := range slow {
		if ev.Type != "BOOKMARK" {
			got = append(got, ev.toCheck())
		}
	}
	if len(got) >= len(want) {
		t.Fatalf("the slow client received all %d events before being cut off", len(got))
	}
	resumeFrom := from
	if len(got) > 0 {
		resumeFrom = got[len(got)-1].RV
	}
	_, rest := e.openWatch(t, ctx, "/api/v1/pods?watch=true&resourceVersion="+strconv.FormatInt(resumeFrom, 10))
	got = append(got, collect(t, ctx, rest, last)...)
	for _, err := range checker.CheckWatch(want, got) {
		t.Error(err)
	}
}

// TestSlowWatcherCatchesUp: a client that stops reading for a while falls
// behind (its queue, 1 MiB here, overflows) but is not disconnected: once it
// reads again, the same stream brings every event exactly once, in order,
// from the replica's ring of recent events. On its own connection to fanout
// (the watch writes on its own goroutine) and through frontdoor (a session's
// pacer writes it).
func TestSlowWatcherCatchesUp(t *testing.T) {
	e := startStack(t, stack.Options{Flags: map[string][]string{"fanout": {"--watcher.queue-events=100", "--watcher.queue-bytes=1048576"}}})
	ctx := testContext(t, 3*time.Minute)
	fanout := e.Proc("fanout-0")
	for _, tc := range []struct {
		name   string
		base   string
		client *http.Client
	}{
		{"fanout", "http://" + fanout.Addrs["http"], &http.Client{Transport: slowTransport(&http.Transport{DisableCompression: true})}},
		{"frontdoor", e.FrontdoorURL, &http.Client{Transport: bearer{token: e.Token, base: slowTransport(e.TLSTransport())}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			from := e.rev(t, ctx)
			startReading := make(chan struct{})
			slow := slowWatch(t, ctx, tc.client, tc.base+"/api/v1/pods?watch=true&resourceVersion="+strconv.FormatInt(from, 10), startReading)

			// 300 small pods and 100 of 128 KiB (12.8 MiB): more than the
			// queue and the socket buffers hold, and far less than the
			// ring (10,240 events, 64 MiB).
			// Namespaces of their own: every pod is new (ADDED, then
			// MODIFIED).
			small, bulk := "slow-"+tc.name, "bulk-"+tc.name
			for i := range 300 {
				name := fmt.Sprintf("p%02d", i%40)
				e.put(t, ctx, small, name, bigPod(small, name, i, 1024), false)
				if i%3 == 0 {
					e.put(t, ctx, bulk, name, bigPod(bulk, name, i, 128<<10), false)
				}
			}
			eventually(t, ctx, "the slow watcher falls behind", func() string {
				if n := metric(t, fanout, "herald_fanout_watchers_behind"); n != 1 {
					return fmt.Sprintf("herald_fanout_watchers_behind = %v", n)
				}
				return ""
			})
			history, err := checker.EtcdHistory(ctx, e.etcd, "/registry/pods/", from+1, e.rev(t, ctx))
			if err != nil {
				t.Fatal(err)
			}
			want := checker.ExpectedEvents("/registry/pods/", history, nil)
			close(startReading)
			got := collect(t, ctx, slow, want[len(want)-1].RV)
			for _, err := range checker.CheckWatch(want, got) {
				t.Error(err)
			}
			if n := metricLabeled(t, fanout, "apiserver_terminated_watchers_total", `reason="queue_full"`); n != 0 {
				t.Errorf("%v watchers terminated as too slow, want none", n)
			}
			eventually(t, ctx, "the watcher has caught up", func() string {
				if n := metric(t, fanout, "herald_fanout_watchers_behind"); n != 0 {
					return fmt.Sprintf("herald_fanout_watchers_behind = %v", n)
				}
				return ""
			})
		})
	}
}

// TestFanoutReplicaKilled: three fanout replicas; one is killed under
// churn; every client it served resumes on the others through frontdoor:
// nothing lost, duplicated or reordered, and no 410.
func TestFanoutReplicaKilled(t *testing.T) {
	e := startStack(t, stack.Options{Fanouts: 3})
	ctx := testContext(t, 3*time.Minute)
	from := e.rev(t, ctx)
	var clients []*resumingClient
	for i := range 30 {
		path := "/api/v1/pods?watch=true&allowWatchBookmarks=true"
		if i%3 == 1 {
			path = "/api/v1/namespaces/k/pods?watch=true&allowWatchBookmarks=true"
		}
		clients = append(clients, e.resumingClient(ctx, path, from))
	}
	victim := e.Proc("fanout-1")
	for metric(t, victim, "herald_fanout_watchers") == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("no watcher reached fanout-1")
		case <-time.After(20 * time.Millisecond):
		}
	}
	onVictim := metric(t, victim, "herald_fanout_watchers")
	var wg sync.WaitGroup
	w := &writer{e: e, ns: "k"}
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.run(ctx, 400, map[int]func(){150: victim.Kill})
	}()
	wg.Wait()
	last := w.lastRev()
	history, err := checker.EtcdHistory(ctx, e.etcd, "/registry/pods/", from+1, last)
	if err != nil {
		t.Fatal(err)
	}
	want := checker.ExpectedEvents("/registry/pods/", history, nil)
	reconnected := 0
	for i, c := range clients {
		for _, err := range checker.CheckWatch(want, c.until(t, ctx, last)) {
			t.Errorf("client %d: %v", i, err)
		}
		if c.expired() {
			t.Errorf("client %d got 410", i)
		}
		if c.reconnects() > 0 {
			reconnected++
		}
	}
	if reconnected < int(onVictim) {
		t.Errorf("%d clients reconnected, but %v watched on the killed replica", reconnected, onVictim)
	}
	t.Logf("%v of 30 clients were on the killed replica; %d reconnected; %d events each", onVictim, reconnected, len(want))
}

package loadgen

import (
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Every watcher goes to exactly one child, children's shares differ by at
// most one, and each half of the watchers spreads over every child.
func TestProcShare(t *testing.T) {
	specs := watcherSpecs(&Target{BaseURLs: []string{"a", "b"}, Token: func(i int) string { return fmt.Sprint("t", i) }},
		Workload{Watchers: 10, Kubelet: true}, 5)
	seen := map[int]int{}
	for k := range 3 {
		share := procShare(specs, k, 3)
		if n := len(share); n < 3 || n > 4 {
			t.Errorf("child %d holds %d of 10", k, n)
		}
		firstHalf := 0
		for _, sp := range share {
			seen[sp.I]++
			if sp.I < 5 {
				firstHalf++
			}
		}
		if firstHalf == 0 {
			t.Errorf("child %d opens none of the first half", k)
		}
	}
	for i := range 10 {
		if seen[i] != 1 {
			t.Errorf("watcher %d in %d shares", i, seen[i])
		}
	}
	if sp := specs[7]; sp.Node != 3 || sp.URL != "b" || sp.Token != "t7" {
		t.Errorf("watcher 7: %+v, want node 3 (spread over 5), URL b, token t7", sp)
	}
}

func TestCheckWatcherProcs(t *testing.T) {
	for _, tc := range []struct {
		watchers, procs int
		ok              bool
	}{{50000, 4, true}, {50000, 3, false}, {2000, 2, true}, {5000, 0, true}, {10, 251, false}} {
		if err := CheckWatcherProcs(tc.watchers, tc.procs); (err == nil) != tc.ok {
			t.Errorf("CheckWatcherProcs(%d, %d) = %v, want ok %v", tc.watchers, tc.procs, err, tc.ok)
		}
	}
	if got := procAddr(0).String(); got != "127.0.0.2" {
		t.Errorf("child 0 dials from %s, want 127.0.0.2", got)
	}
	if got := procAddr(251).String(); got != "127.0.0.3" {
		t.Errorf("child 251 dials from %s, want 127.0.0.3 (wrapped)", got)
	}
}

// The parent rebuilds each child's watchers at their indexes, as the
// checks read them.
func TestMergeRecords(t *testing.T) {
	specs := []watcherSpec{{I: 0, Node: 4}, {I: 1, Node: 5}, {I: 2, Node: 6}}
	ws, err := mergeRecords(3, specs, [][]watcherRecord{
		{{I: 0, Revs: []int64{7, 9}, Lat: []int32{100, 200}, Size: []int32{50, 50}, Resumes: 1}, {I: 2, OpenFailed: true, Err: "watch: 429"}},
		{{I: 1, Revs: []int64{8}, Lat: []int32{300}, Size: []int32{60}, Err: "ERROR event"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if x := ws[0]; x.node != 4 || !slices.Equal(x.revs, []int64{7, 9}) || x.resumes != 1 || x.err != nil || x.last.Load() != 9 || !closed(x.done) {
		t.Errorf("watcher 0: %+v", x)
	}
	if x := ws[1]; x.node != 5 || x.err == nil || x.err.Error() != "ERROR event" || x.openFailed {
		t.Errorf("watcher 1: %+v", x)
	}
	if x := ws[2]; !x.openFailed || x.err == nil || len(x.revs) != 0 {
		t.Errorf("watcher 2: %+v", x)
	}
	if _, err := mergeRecords(3, specs, [][]watcherRecord{{{I: 1}}, {{I: 1}}}); err == nil {
		t.Error("a watcher reported by two children merged")
	}
}

// Two children, each holding its share from its own source address, open,
// drain and report what every watcher received.
func TestWatcherProcsServeWatchers(t *testing.T) {
	var mu sync.Mutex
	sources := map[string]int{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		mu.Lock()
		sources[host]++
		mu.Unlock()
		for rv := 10; rv <= 12; rv++ {
			fmt.Fprintf(w, `{"type":"MODIFIED","object":{"metadata":{"resourceVersion":"%d","annotations":{"%s":"%d"}}}}`+"\n", rv, WrittenAtAnnotation, time.Now().UnixNano())
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}

	var procs []*watcherProc
	for range 2 {
		inR, inW := io.Pipe()
		outR, outW := io.Pipe()
		done := make(chan error, 1)
		go func() {
			err := ServeWatchers(context.Background(), inR, outW)
			outW.Close()
			done <- err
		}()
		procs = append(procs, newWatcherProc(0, inW, outR, func() error { return <-done }, func() error { return nil }))
	}
	w := Workload{Watchers: 5, Kubelet: true}
	specs := watcherSpecs(&Target{BaseURL: srv.URL, Token: func(int) string { return "token" }}, w, 5)
	f, err := setupWatcherProcs(procs, 0, ca, w, specs, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, half := range [][2]int{{0, 2}, {2, 5}} {
		if failed, first, err := f.open(half[0], half[1]); failed != 0 || err != nil {
			t.Fatalf("open %v: %d failed (%s), %v", half, failed, first, err)
		}
	}
	lastAt, err := f.drain(func(int) int64 { return 12 }, time.Now().Add(10*time.Second))
	if err != nil || lastAt == 0 {
		t.Fatalf("drain: last event at %d, %v", lastAt, err)
	}
	ws, err := f.close()
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range ws {
		if x == nil || !slices.Equal(x.revs, []int64{10, 11, 12}) || x.err != nil || x.node != i {
			t.Errorf("watcher %d: %+v", i, x)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if sources["127.0.0.2"] != 3 || sources["127.0.0.3"] != 2 {
		t.Errorf("connections by source address: %v, want 3 from 127.0.0.2 and 2 from 127.0.0.3", sources)
	}
	if ws, err := f.close(); ws != nil || err != nil {
		t.Errorf("second close: %v, %v", ws, err)
	}
}

// Memory per watch of every process together: the second half's growth
// summed over the processes read at both points.
func TestTotalPerWatcher(t *testing.T) {
	heap, rss := totalPerWatcher(map[string]uint64{"a": 1000, "b": 2000}, map[string]uint64{"a": 3000, "b": 6000, "c": 9000},
		map[string]uint64{"a": 10, "b": 10}, map[string]uint64{"a": 110, "b": 210, "c": 5}, 100)
	if heap != 60 || rss != 3 {
		t.Errorf("heap %v rss %v per watcher, want 60 and 3", heap, rss)
	}
	if heap, _ := totalPerWatcher(nil, nil, nil, nil, 100); heap != -1 {
		t.Errorf("nothing read: %v, want -1", heap)
	}
}

func TestReportScaleOut(t *testing.T) {
	var b strings.Builder
	wl := Workload{Name: "x", Replicas: 4, ScaleOutWorkload: ScaleOutWorkload{Procs: 4, KubeReplicas: 3}}
	h := &Result{ScaleOut: ScaleOut{OpenTime: 12 * time.Second, ClientProcs: 4, HeapTotalPerWatcher: 8000, RSSTotalPerWatcher: -1, EtcdWatchStreams: 2, EtcdWatchers: 3}}
	writeScaleOut(&b, wl, h, nil)
	for _, want := range []string{"| time to open every watch (s, first to last, both halves) | 12.0 | not measured |", "| heap per watch, every server process (KB) | 8.0 |", "| RSS per watch, every server process (KB) | not measured |", "| etcd watchers | 3 |", "3 kube-apiserver replicas"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	writeScaleOut(&b, Workload{Name: "y"}, h, nil)
	if b.Len() != 0 {
		t.Errorf("a workload without scale-out writes %q", b.String())
	}
}

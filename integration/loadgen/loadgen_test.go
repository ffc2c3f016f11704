package loadgen

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestCompare(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		expected, got        []int64
		missing, dup, unexpd int
	}{
		{"exact", []int64{1, 2, 3}, []int64{1, 2, 3}, 0, 0, 0},
		{"nothing", []int64{1, 2, 3}, nil, 3, 0, 0},
		{"gap", []int64{1, 2, 3, 4}, []int64{1, 4}, 2, 0, 0},
		{"duplicate", []int64{1, 2}, []int64{1, 1, 2, 2, 2}, 0, 3, 0},
		{"unexpected", []int64{2}, []int64{1, 2, 5}, 0, 0, 2},
		{"reordered", []int64{1, 2, 3}, []int64{2, 1, 3}, 0, 0, 0},
		{"all kinds", []int64{1, 3, 5}, []int64{0, 3, 3, 6}, 2, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, d, u := compare(tc.expected, tc.got)
			if m != tc.missing || d != tc.dup || u != tc.unexpd {
				t.Fatalf("compare = missing %d, dup %d, unexpected %d; want %d, %d, %d", m, d, u, tc.missing, tc.dup, tc.unexpd)
			}
		})
	}
}

// The watcher picks type, resourceVersion and the write time out of real
// event lines without decoding them.
func TestWatcherEvent(t *testing.T) {
	p := NewPods(3, 3)
	at := time.Now().Add(-5 * time.Millisecond)
	var obj map[string]any
	if err := json.Unmarshal([]byte(p.value(1, at)), &obj); err != nil {
		t.Fatal(err)
	}
	obj["metadata"].(map[string]any)["resourceVersion"] = "42"
	b, _ := json.Marshal(map[string]any{"type": "MODIFIED", "object": obj})
	w := &watcher{node: -1}
	if err := w.event(append(b, '\n'), at.Add(5*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if len(w.revs) != 1 || w.revs[0] != 42 || w.lat[0] != 5000 {
		t.Fatalf("revs %v, latencies %v µs; want [42], [5000]", w.revs, w.lat)
	}
	if err := w.event([]byte(`{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"50"}}}`+"\n"), at); err != nil || len(w.revs) != 1 {
		t.Fatalf("bookmark: %v, revs %v", err, w.revs)
	}
	err := w.event([]byte(`{"type":"ERROR","object":{"kind":"Status","code":410}}`+"\n"), at)
	if err == nil || !strings.Contains(err.Error(), "410") {
		t.Fatalf("ERROR event: %v", err)
	}
	if !strings.Contains(p.value(2, at), `"spec":{"containers"`) || p.Node(4) != "node-1" {
		t.Fatalf("pod layout: %s, %s", p.value(2, at), p.Node(4))
	}
}

// make bench regenerates the report but keeps the hand-written analysis.
func TestReportKeepsAnalysis(t *testing.T) {
	var b strings.Builder
	(&Report{Analysis: "p99 is high because\nthe machine was busy."}).Write(&b)
	if got := KeptAnalysis([]byte(b.String())); got != "p99 is high because\nthe machine was busy." {
		t.Fatalf("kept analysis %q", got)
	}
}

// A profile's summary is what pprof reports, never what the go command
// writes to standard error around it: with GODEBUG=gctrace=1 in the
// environment every Go program, the go command among them, traces its
// collections there.
func TestPprofTopIsTheReportOnly(t *testing.T) {
	f := filepath.Join(t.TempDir(), "cpu.pprof")
	out, err := os.Create(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		t.Fatal(err)
	}
	pprof.StopCPUProfile()
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GODEBUG", "gctrace=1")
	top, err := PprofTop(f, 5)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(top, "flat") {
		t.Fatalf("no pprof report in %q", top)
	}
	for _, l := range strings.Split(top, "\n") {
		if strings.HasPrefix(l, "gc ") || strings.HasPrefix(l, "# ") {
			t.Fatalf("the go command's standard error in the summary: %q", l)
		}
	}
	if _, err := PprofTop(filepath.Join(t.TempDir(), "missing.pprof"), 5); err == nil {
		t.Fatal("a missing profile summarized without an error")
	}
}

// The run-queue wait is compared like the CPU, per 1,000 deliveries of the
// whole stack; the steal is the machine's, shown for each system without a
// ratio, and "not measured" where it was not.
func TestReportWaitAndSteal(t *testing.T) {
	wl := Workload{Name: "w"}
	h := &Result{Target: "Herald", Workload: "w", Deliveries: 2000, CPU: map[string]float64{"a": 10, "b": 10},
		Wait: map[string]float64{"a": 300, "b": 100}, Slices: map[string]float64{"a": 5, "b": 7}, Steal: 0.125}
	k := &Result{Target: "kube-apiserver", Workload: "w", Deliveries: 2000, CPU: map[string]float64{"c": 10},
		Wait: map[string]float64{"c": 800}, Steal: -1}
	var b strings.Builder
	(&Report{Workloads: []Workload{wl}, Herald: map[string]*Result{"w": h}, Kube: map[string]*Result{"w": k},
		HeraldRounds: map[string][]*Result{"w": {h, h}}, KubeRounds: map[string][]*Result{"w": {k, k}}}).Write(&b)
	for _, want := range []string{
		"| server run-queue wait per 1,000 deliveries (ms, whole stack: runnable, not running) | 200.00 | 400.00 | 0.50 |",
		"| machine's CPU time stolen by the hypervisor, first write to last delivery (%) | 12.5 | not measured | – |",
		"run-queue wait by process (ms): a 300, b 100; times put on a CPU by process: a 5, b 7;",
		"run-queue wait by process (ms): c 800; times put on a CPU by process: not measured;",
		"2000/0 delivered, 12.5% stolen; p99",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "-100.0% stolen") {
		t.Errorf("kube-apiserver's every-run line shows an unmeasured steal:\n%s", b.String())
	}
}

func TestHistogramQuantile(t *testing.T) {
	before := histogram{bounds: []float64{0.001, 0.002, 0.004, math.Inf(1)}, counts: []float64{10, 10, 10, 10}}
	after := histogram{bounds: before.bounds, counts: []float64{10, 60, 110, 110}}
	d := after.since(before)
	// 100 new observations: 50 in (1ms, 2ms], 50 in (2ms, 4ms].
	if got, want := d.quantile(0.5), 2*time.Millisecond; got != want {
		t.Errorf("p50 = %v, want %v", got, want)
	}
	if got, want := d.quantile(0.99), 3960*time.Microsecond; (got - want).Abs() > time.Microsecond {
		t.Errorf("p99 = %v, want %v", got, want)
	}
	if got := (histogram{}).quantile(0.5); got != 0 {
		t.Errorf("empty histogram p50 = %v, want 0", got)
	}
}

func TestMedian(t *testing.T) {
	rs := []*Result{{Target: "a", P99: 30, Deliveries: 1}, {Target: "b", P99: 10, Deliveries: 1}, {Target: "c", P99: 20, Deliveries: 1}}
	if got := Median(rs); got.Target != "c" {
		t.Errorf("median of p99 30, 10, 20 is run %s, want c", got.Target)
	}
	if got := Median(rs[:1]); got.Target != "a" {
		t.Errorf("median of one run is %s, want a", got.Target)
	}
	if rs[0].Target != "a" {
		t.Error("Median reordered its argument")
	}
	// A run that delivered nothing (p99 0) is the worst, not the best.
	none := []*Result{{Target: "x", P99: 40, Deliveries: 1}, {Target: "none"}, {Target: "y", P99: 50, Deliveries: 1}}
	if got := Median(none); got.Target != "y" {
		t.Errorf("median with an empty run is %s, want y", got.Target)
	}
}

// Every watcher has a connection of its own unless the workload
// multiplexes; then Mux consecutive watchers share one HTTP/2 client.
func TestWatchClients(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(t.TempDir(), "ca.crt")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)

	own, closeOwn, err := WatchClients(ca, Workload{}, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer closeOwn()
	if own[0] == own[1] || own[1] == own[2] {
		t.Fatal("watchers share a client without Mux")
	}
	if p := own[0].Transport.(*http.Transport).Protocols; !p.HTTP1() || p.HTTP2() {
		t.Fatalf("default protocols %v, want HTTP/1.1 only", p)
	}
	mux, closeMux, err := WatchClients(ca, Workload{Mux: 100}, 250)
	if err != nil {
		t.Fatal(err)
	}
	defer closeMux()
	if mux[0] != mux[99] || mux[99] == mux[100] || mux[100] != mux[199] || mux[199] == mux[200] || mux[200] != mux[249] {
		t.Fatal("Mux 100 does not group 100 consecutive watchers per client")
	}
	if p := mux[0].Transport.(*http.Transport).Protocols; p.HTTP1() || !p.HTTP2() {
		t.Fatalf("multiplexed protocols %v, want HTTP/2 only", p)
	}
}

// A stage served by several replicas is the sum of their histograms.
func TestStageSumsReplicas(t *testing.T) {
	serve := func(counts ...int) string {
		body := fmt.Sprintf("# TYPE d histogram\nd_bucket{le=\"0.001\"} %d\nd_bucket{le=\"0.01\"} %d\nd_bucket{le=\"+Inf\"} %d\nd_count %d\n", counts[0], counts[1], counts[2], counts[2])
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) }))
		t.Cleanup(s.Close)
		return s.URL + "/metrics"
	}
	st := Stage{Name: "d", URLs: []string{serve(1, 2, 2), serve(3, 5, 6)}, Metric: "d"}
	h, err := readHistogram(t.Context(), http.DefaultClient, st)
	if err != nil {
		t.Fatal(err)
	}
	if want := []float64{4, 7, 8}; !slices.Equal(h.counts, want) {
		t.Fatalf("summed counts %v, want %v", h.counts, want)
	}
}

// Watchers spread round-robin over the target's frontdoors.
func TestWatchURL(t *testing.T) {
	one := &Target{BaseURL: "https://a"}
	if one.watchURL(0) != "https://a" || one.watchURL(7) != "https://a" {
		t.Fatal("without BaseURLs every watcher uses BaseURL")
	}
	three := &Target{BaseURL: "https://a", BaseURLs: []string{"https://a", "https://b", "https://c"}}
	var got []string
	for i := range 5 {
		got = append(got, three.watchURL(i))
	}
	if want := []string{"https://a", "https://b", "https://c", "https://a", "https://b"}; !slices.Equal(got, want) {
		t.Fatalf("watch URLs %v, want %v", got, want)
	}
}

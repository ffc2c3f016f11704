package audit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
)

// The audit file is rotated before it would pass its size, keeping the
// configured number of old files, newest first, every line whole.
func TestAuditFileRotates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	f, err := openRotating(path, 100, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 7 {
		if err := f.write([]byte(fmt.Sprintf("line %02d %s\n", i, strings.Repeat("x", 31)))); err != nil { // 40 bytes
			t.Fatal(err)
		}
	}
	if err := f.close(); err != nil {
		t.Fatal(err)
	}
	lines := func(p string) []string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			out = append(out, l[:7])
		}
		return out
	}
	for p, want := range map[string]string{path + ".2": "[line 02 line 03]", path + ".1": "[line 04 line 05]", path: "[line 06]"} {
		if got := fmt.Sprint(lines(p)); got != want {
			t.Errorf("%s: %s, want %s", filepath.Base(p), got, want)
		}
	}
	if _, err := os.Stat(path + ".3"); !os.IsNotExist(err) {
		t.Errorf("a third backup was kept: %v", err)
	}
}

// gateSink blocks every write until released: a disk that stalls.
type gateSink struct {
	gate    chan struct{}
	written []string
}

func (g *gateSink) write(b []byte) error {
	<-g.gate
	g.written = append(g.written, string(b))
	return nil
}
func (g *gateSink) flush() error { return nil }
func (g *gateSink) close() error { return nil }

// A stalled writer never holds the request that emits an event: past the
// queue, events are dropped and counted; what was queued is written by
// close.
func TestAuditLogNeverBlocksRequests(t *testing.T) {
	reg := prometheus.NewRegistry()
	sink := &gateSink{gate: make(chan struct{})}
	l := &Log{queue: make(chan []byte, 4), stop: make(chan struct{}), done: make(chan struct{}), log: slog.New(slog.DiscardHandler), out: sink,
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "d"}), failed: prometheus.NewCounter(prometheus.CounterOpts{Name: "f"})}
	reg.MustRegister(l.dropped)
	go l.run()
	start := time.Now()
	for i := range 100 {
		l.emit(&auditv1.Event{AuditID: types.UID(fmt.Sprint("id-", i)), Stage: auditv1.StageResponseComplete})
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("100 events took %v with a stalled writer", d)
	}
	close(sink.gate)
	l.Close()
	l.Close() // twice: no effect
	mfs, _ := reg.Gather()
	dropped := mfs[0].GetMetric()[0].GetCounter().GetValue()
	if int(dropped)+len(sink.written) != 100 || dropped < 90 {
		t.Errorf("dropped %v, written %d: want all 100 accounted for, at most 5 written (the queue and the one in the writer)", dropped, len(sink.written))
	}
	for _, line := range sink.written {
		var ev auditv1.Event
		if err := json.NewDecoder(bufio.NewReader(strings.NewReader(line))).Decode(&ev); err != nil || ev.Stage != auditv1.StageResponseComplete {
			t.Errorf("line %q: %v", line, err)
		}
	}
	l.emit(&auditv1.Event{AuditID: "late"}) // after close: dropped, no panic
}

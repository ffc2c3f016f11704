package watchsession

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
)

// BenchmarkSessionBroadcast: the hop's cost per delivery, both ends in
// process over loopback: one session of streams watches, each written
// every event of a broadcast (1.5 KB, shared) as a write of its own, as
// fanout's pacer writes them; frontdoor's side reads every stream's body.
// cpu-ns/delivery is the process's CPU time (both ends) per event per
// stream.
func BenchmarkSessionBroadcast(b *testing.B) {
	for _, streams := range []int{10, 100} {
		b.Run(fmt.Sprintf("streams=%d", streams), func(b *testing.B) {
			events := blobs(64, 1500)
			n := b.N
			srv, _ := serve(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				sw := w.(SegmentWriter)
				w.WriteHeader(http.StatusOK)
				for i := range n {
					if _, err := sw.WriteSegments([]Segment{{B: events[i%len(events)], Shared: true}}); err != nil {
						return
					}
				}
			}))
			c := &Client{MaxStreams: streams, SharedWindow: 16 << 20}
			defer c.Close()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime()
			var wg sync.WaitGroup
			for range streams {
				wg.Go(func() {
					resp, err := watch(c, context.Background(), srv.URL+"/x")
					if err != nil {
						b.Error(err)
						return
					}
					defer resp.Body.Close()
					got, _ := io.Copy(io.Discard, resp.Body)
					if want := int64(n) * 1500; got != want {
						b.Errorf("%d bytes, want %d", got, want)
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(n*streams), "cpu-ns/delivery")
		})
	}
}

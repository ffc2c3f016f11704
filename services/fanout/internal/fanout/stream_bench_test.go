package fanout

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"syscall"
	"testing"
	"time"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkStreamWrite: the cost per event of writing watch events to a
// frontdoor-like client over h2c (the fanout hop), both ends in process,
// when the events reach the stream one at a time (batch=1) or ten queued
// together (batch=10, a watcher behind under load). Compare commits with
// benchstat.
func BenchmarkStreamWrite(b *testing.B) {
	line := encodeLine("MODIFIED", append([]byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"x"},"spec":"`), append(bytes.Repeat([]byte("x"), 1150), `"}`...)...))
	for _, batch := range []int{1, 10} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			done := make(chan struct{})
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer close(done)
				st := &stream{w: w, rc: http.NewResponseController(w), batches: &sync.Pool{}}
				w.WriteHeader(http.StatusOK)
				st.flush()
				for i := 0; i < b.N; i += batch {
					for range min(batch, b.N-i) {
						st.raw(line)
					}
					st.flush()
				}
			}))
			srv.Config.Protocols = new(http.Protocols)
			srv.Config.Protocols.SetUnencryptedHTTP2(true)
			srv.Start()
			defer srv.Close()
			p := new(http.Protocols)
			p.SetUnencryptedHTTP2(true)
			c := &http.Client{Transport: &http.Transport{Protocols: p}}
			b.SetBytes(int64(len(line)))
			b.ReportAllocs()
			cpu0 := cpuTime()
			b.ResetTimer()
			resp, err := c.Get(srv.URL)
			if err != nil {
				b.Fatal(err)
			}
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			<-done
			b.StopTimer()
			// The machine is shared: CPU time (both ends, this process) is
			// steadier than wall time.
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
			if want := int64(b.N) * int64(len(line)); n != want {
				b.Fatalf("read %d bytes, want %d", n, want)
			}
		})
	}
}

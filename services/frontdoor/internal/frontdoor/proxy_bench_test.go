package frontdoor

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"herald.dev/libs/storage"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkWatchProxy: the cost per event of a watch through frontdoor, in
// process: a fanout replica (h2c) writes ~1.2 KB events, batch at a time
// with a flush after each batch (batch=10: a watcher behind, under load),
// and a client reads them over TLS and HTTP/1.1. cpu-ns/op is the CPU time
// of all three per event (the machine is shared: steadier than wall time).
func BenchmarkWatchProxy(b *testing.B) {
	line := append([]byte(`{"type":"MODIFIED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"x"},"spec":"`), bytes.Repeat([]byte("x"), 1150)...)
	line = append(line, "\"}}\n"...)
	for _, batch := range []int{1, 10} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			fan := newFanoutFake(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", storage.MediaJSON) // a watch stream, as fanout sends it
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				for i := 0; i < b.N; i += batch {
					for range min(batch, b.N-i) {
						w.Write(line)
					}
					w.(http.Flusher).Flush()
				}
			}))
			defer fan.Close()
			s, _ := testServer(b, fan.URL, nil)
			front := httptest.NewUnstartedServer(s)
			front.StartTLS()
			defer front.Close()
			req, _ := http.NewRequest(http.MethodGet, front.URL+"/api/v1/namespaces/ns1/pods?watch=true", nil)
			req.Header.Set("Authorization", "Bearer "+tokAlice)
			b.SetBytes(int64(len(line)))
			b.ReportAllocs()
			cpu0 := cpuTime()
			b.ResetTimer()
			resp, err := front.Client().Do(req)
			if err != nil {
				b.Fatal(err)
			}
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
			if want := int64(b.N) * int64(len(line)); resp.StatusCode != 200 || n != want {
				b.Fatalf("%d, read %d bytes, want %d", resp.StatusCode, n, want)
			}
		})
	}
}

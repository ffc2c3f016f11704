package service

import (
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// BenchmarkGatherWrites writes HTTP/2-sized frames, each in net/http's two
// pieces (a full 4 KB buffer, then the rest at its flush), to a loopback TCP
// connection drained by a reader, as a fanout replica's serve loop does under
// load: directly (hold 0) and gathered. It reports the socket writes per
// frame; ns/op includes the receiver's side of loopback.
func BenchmarkGatherWrites(b *testing.B) {
	for _, hold := range []time.Duration{0, time.Millisecond} {
		b.Run(fmt.Sprintf("hold=%v", hold), func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				io.Copy(io.Discard, c)
				c.Close()
			}()
			raw, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			counted := &countingConn{Conn: raw, l: &countingListener{}}
			var w net.Conn = counted
			if hold > 0 {
				w = newGatherConn(counted, hold, time.Now, realTimer)
			}
			defer w.Close()
			full, rest := make([]byte, 4096), make([]byte, 3500)
			b.SetBytes(int64(len(full) + len(rest)))
			b.ResetTimer()
			for range b.N {
				if _, err := w.Write(full); err != nil {
					b.Fatal(err)
				}
				if _, err := w.Write(rest); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			_, writes := counted.l.counts()
			b.ReportMetric(float64(writes)/float64(b.N), "socket-writes/frame")
		})
	}
}

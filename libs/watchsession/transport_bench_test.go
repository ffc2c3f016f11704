package watchsession

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
)

// BenchmarkTransport measures what carrying a session's frames costs, in
// CPU time of the whole process (both ends) per session write and per KB,
// on three transports over loopback TCP:
//
//   - h2c: the frames as the body of one HTTP/2 response (net/http's server
//     and client, 4 MiB stream window), as sessions were first carried;
//   - grpc: one message of a bidirectional gRPC stream per session write
//     (raw bytes, no protobuf copy; static 64 MiB windows, so that gRPC's
//     flow control never holds a write back);
//   - tcp: the frames written to the connection as they are.
//
// Each write is a batch of data frames of 1.5 KB events (a session's
// writer sends what its watches appended meanwhile in one write); the
// reader parses every frame's header as a session's reader does.
func BenchmarkTransport(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10} {
		batch := benchBatch(size)
		for _, tr := range []struct {
			name string
			run  func(b *testing.B, batch []byte)
		}{{"h2c", benchH2C}, {"grpc", benchGRPC}, {"tcp", benchTCP}} {
			b.Run(fmt.Sprintf("%s/write=%dKiB", tr.name, size>>10), func(b *testing.B) {
				b.SetBytes(int64(len(batch)))
				before := cpuTime()
				tr.run(b, batch)
				cpu := cpuTime() - before
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/write")
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N)/float64(len(batch)>>10), "cpu-ns/KiB")
			})
		}
	}
}

// benchBatch is size bytes of data frames of 1.5 KB events.
func benchBatch(size int) []byte {
	ev := make([]byte, 1500)
	for i := range ev {
		ev[i] = 'a' + byte(i%26)
	}
	var out []byte
	for id := uint32(1); len(out) < size; id++ {
		out = appendFrame(out, frameData, id, ev[:min(len(ev), size-len(out))])
	}
	return out
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// readBench reads frames until want bytes of them have come.
func readBench(r io.Reader, want int64) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var got int64
	for got < want {
		_, _, n, err := readHeader(br)
		if err != nil {
			return err
		}
		if _, err := br.Discard(n); err != nil {
			return err
		}
		got += int64(headerLen + n)
	}
	return nil
}

func benchListener(b *testing.B) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	return ln
}

func benchH2C(b *testing.B, batch []byte) {
	ln := benchListener(b)
	n := b.N
	h2c := new(http.Protocols)
	h2c.SetUnencryptedHTTP2(true)
	srv := &http.Server{Protocols: h2c, HTTP2: &http.HTTP2Config{MaxReceiveBufferPerStream: window},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rc := http.NewResponseController(w)
			for range n {
				if _, err := w.Write(batch); err != nil {
					return
				}
				if rc.Flush() != nil {
					return
				}
			}
		})}
	go srv.Serve(ln)
	defer srv.Close()
	tr := &http.Transport{Protocols: h2c, HTTP2: &http.HTTP2Config{MaxReceiveBufferPerStream: window}}
	defer tr.CloseIdleConnections()
	b.ResetTimer()
	req, _ := http.NewRequest(http.MethodPost, "http://"+ln.Addr().String()+Path, http.NoBody)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if err := readBench(resp.Body, int64(n)*int64(len(batch))); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
}

// rawCodec passes a message's bytes as they are.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append((*v.(*[]byte))[:0], data...)
	return nil
}
func (rawCodec) Name() string { return "herald-bench-raw" }

func init() { encoding.RegisterCodec(rawCodec{}) }

func benchGRPC(b *testing.B, batch []byte) {
	ln := benchListener(b)
	n := b.N
	const win = 64 << 20
	srv := grpc.NewServer(grpc.StaticStreamWindowSize(win), grpc.StaticConnWindowSize(win), grpc.ForceServerCodec(rawCodec{}))
	srv.RegisterService(&grpc.ServiceDesc{ServiceName: "bench.Session", HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Open", ServerStreams: true, ClientStreams: true,
			Handler: func(_ any, s grpc.ServerStream) error {
				for range n {
					msg := batch
					if err := s.SendMsg(&msg); err != nil {
						return err
					}
				}
				return nil
			}}}}, struct{}{})
	go srv.Serve(ln)
	defer srv.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStaticStreamWindowSize(win), grpc.WithStaticConnWindowSize(win),
		grpc.WithDefaultCallOptions(grpc.CallContentSubtype("herald-bench-raw"), grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	b.ResetTimer()
	cs, err := conn.NewStream(context.Background(), &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/bench.Session/Open")
	if err != nil {
		b.Fatal(err)
	}
	var buf []byte
	for range n {
		if err := cs.RecvMsg(&buf); err != nil {
			b.Fatal(err)
		}
		// The frames of the message, parsed as a session's reader does.
		if err := readBenchBytes(buf); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
}

func readBenchBytes(p []byte) error {
	for off := 0; off < len(p); {
		if len(p)-off < headerLen {
			return errors.New("short frame")
		}
		off += headerLen + frameLen(p, off)
	}
	return nil
}

func benchTCP(b *testing.B, batch []byte) {
	ln := benchListener(b)
	defer ln.Close()
	n := b.N
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		for range n {
			if _, err := c.Write(batch); err != nil {
				return
			}
		}
	}()
	b.ResetTimer()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if err := readBench(c, int64(n)*int64(len(batch))); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
}

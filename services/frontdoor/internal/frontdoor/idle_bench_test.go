package frontdoor

import (
	"bufio"
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"herald.dev/libs/service"
	"herald.dev/libs/storage"
)

var idleHeapProfile = flag.String("idle-heap-profile", "", "BenchmarkIdleWatchHeap: write a heap profile (every allocation sampled) with every watch open and idle to this file")

// idleHelperEnv selects TestIdleWatchHelper's role in a child process.
const idleHelperEnv = "HERALD_IDLE_WATCH_HELPER"

// BenchmarkIdleWatchHeap: the Go heap frontdoor holds per idle watch, as
// herald-load measures it (heap in use after a forced GC, growth between no
// watch and every watch open and idle, divided by the watches), for a
// fleet of clients each on its own TLS connection (HTTP/1.1) and for
// clients multiplexed over HTTP/2. The clients and the fanout replica (h2c)
// run in child processes, so that this process's heap is frontdoor's alone;
// frontdoor serves as in production (Server.HTTPServer over TLS). Run it
// with -benchtime 1x: the watches are a fleet, not b.N.
func BenchmarkIdleWatchHeap(b *testing.B) {
	const watches = 1000
	for _, proto := range []string{"http1", "http2"} {
		b.Run(proto, func(b *testing.B) {
			if *idleHeapProfile != "" {
				runtime.MemProfileRate = 1
				defer func() { runtime.MemProfileRate = 512 << 10 }()
			}
			fanAddr, stopFan := idleHelper(b, "fanout")
			defer stopFan()
			s, _ := testServer(b, "http://"+fanAddr, nil)
			srv := &service.HTTPServer{Server: s.HTTPServer(), Addr: "127.0.0.1:0", TLS: true, Grace: time.Second}
			if err := srv.Listen(); err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			go srv.Serve(ctx)
			defer func() { cancel(); srv.Shutdown() }()
			target := "https://" + srv.ListenAddr() + "/api/v1/namespaces/ns1/pods?watch=true"
			// One watch first, opened and ended: what the first watch
			// allocates once (pools, the HTTP/2 connection to the
			// replica, lazily built state) is not a watch's.
			_, stop := idleHelper(b, "clients", target, "1", proto)
			stop()
			for s.watches.InUse() != 0 {
				time.Sleep(time.Millisecond) // polling the watch slots, bounded by the benchmark's timeout
			}
			heap0, live0, stack0 := goMemory()
			_, stopClients := idleHelper(b, "clients", target, strconv.Itoa(watches), proto)
			defer stopClients()
			heap1, live1, stack1 := goMemory()
			if n := s.watches.InUse(); n != watches {
				b.Fatalf("%d watches open, want %d", n, watches)
			}
			b.ReportMetric(float64(int64(heap1)-int64(heap0))/watches, "heap-B/watch")
			b.ReportMetric(float64(int64(live1)-int64(live0))/watches, "live-B/watch")
			b.ReportMetric(float64(int64(stack1)-int64(stack0))/watches, "stack-B/watch")
			b.ReportMetric(float64(runtime.NumGoroutine())/watches, "goroutines/watch")
			if *idleHeapProfile != "" {
				f, err := os.Create(strings.TrimSuffix(*idleHeapProfile, ".pprof") + "-" + proto + ".pprof")
				if err != nil {
					b.Fatal(err)
				}
				defer f.Close()
				if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// goMemory is the Go heap in use after a forced GC (herald-load's
// measure: the spans holding objects), the bytes of the objects live and
// the goroutine stacks in use (not part of the heap).
func goMemory() (inuse, live, stacks uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse, ms.HeapAlloc, ms.StackInuse
}

// idleHelper runs TestIdleWatchHelper in a child process in role with args
// and waits until it is ready; it returns the first line the child printed
// after "ready" and a func that ends the child (closing its stdin).
func idleHelper(b *testing.B, role string, args ...string) (string, func()) {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestIdleWatchHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), idleHelperEnv+"="+role+" "+strings.Join(args, " "))
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	var once sync.Once
	stop := func() { once.Do(func() { stdin.Close(); cmd.Wait() }) }
	line, err := bufio.NewReader(stdout).ReadString('\n')
	ready, ok := strings.CutPrefix(strings.TrimSpace(line), "ready ")
	if err != nil || !ok {
		stop()
		b.Fatalf("helper %s: %q, %v", role, line, err)
	}
	return ready, stop
}

// TestIdleWatchHelper is BenchmarkIdleWatchHeap's child process (it does
// nothing in a normal test run): "fanout" serves watches that stay idle
// (h2c, as a fanout replica), printing its address; "clients <url> <n>
// <http1|http2>" opens n idle watches on url as alice, each on its own
// connection (http1) or multiplexed (http2). Either prints "ready <addr>"
// once serving or every watch has its response headers, then holds
// everything until its stdin closes.
func TestIdleWatchHelper(t *testing.T) {
	role := os.Getenv(idleHelperEnv)
	if role == "" {
		t.Skip("the child process of BenchmarkIdleWatchHeap")
	}
	f := strings.Fields(role)
	switch f[0] {
	case "fanout":
		fan := newFanoutFake(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", storage.MediaJSON) // a watch stream, as fanout sends it
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}))
		defer fan.Close()
		fmt.Printf("ready %s\n", fan.Listener.Addr())
	case "clients":
		n, _ := strconv.Atoi(f[2])
		tr := &http.Transport{
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, // the benchmark's own server
			Protocols:         new(http.Protocols),
			MaxConnsPerHost:   0,
			DisableKeepAlives: f[3] == "http1",
			DialContext:       (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		}
		if f[3] == "http2" {
			tr.Protocols.SetHTTP2(true)
		} else {
			tr.Protocols.SetHTTP1(true)
		}
		var bodies []io.Closer
		for range n {
			req, _ := http.NewRequest(http.MethodGet, f[1], nil)
			req.Header.Set("Authorization", "Bearer "+tokAlice)
			req.Header.Set("Accept", "application/json")
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("watch: %d", resp.StatusCode)
			}
			bodies = append(bodies, resp.Body)
		}
		defer func() {
			for _, b := range bodies {
				b.Close()
			}
		}()
		fmt.Printf("ready %d\n", n)
	default:
		t.Fatalf("unknown role %q", role)
	}
	io.Copy(io.Discard, os.Stdin)
}

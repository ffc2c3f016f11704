package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"herald.dev/integration/stack"
)

const floodRBAC = securityRBAC + `
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: mallory}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pod-reader}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: mallory}]
`

// TestFloodAndSlowloris: with frontdoor limited to 20 watches (10 per
// user), 200 concurrent watch connection attempts by one user and then 60
// slowloris connections leave existing watchers unaffected (every event
// arrives), leave room for other users, get 429 + Retry-After or a closed
// connection, and keep frontdoor's memory bounded.
func TestFloodAndSlowloris(t *testing.T) {
	const maxWatches, perUser, attempts = 20, 10, 200
	fx := newSecurityFixture(t, floodRBAC)
	flags := append(fx.flags, "--max-watches="+strconv.Itoa(maxWatches), "--max-watches-per-user="+strconv.Itoa(perUser), "--read-header-timeout=2s")
	e := startStack(t, stack.Options{Flags: map[string][]string{"frontdoor": flags}})
	addTokens(t, e, "mallory-token,mallory,u-mallory", "alice-token,alice,u-alice")
	ctx := testContext(t, 55*time.Second)
	front := e.Proc("frontdoor-0")

	// Three existing watchers (the admin's), from now on.
	var list podList
	if code := e.get(t, "/api/v1/pods", &list); code != http.StatusOK {
		t.Fatalf("LIST: %d", code)
	}
	var watchers []<-chan watchEvent
	for range 3 {
		_, ch := e.openWatch(t, ctx, "/api/v1/pods?watch=true&resourceVersion="+list.Metadata.ResourceVersion)
		watchers = append(watchers, ch)
	}
	rss0 := rssBytes(t, front.Pid())

	// The writer keeps changing pods while the attacks run.
	var lastRV atomic.Int64
	var writes atomic.Int64
	writerDone := make(chan struct{})
	stopWriter := make(chan struct{})
	go func() {
		defer close(writerDone)
		for i := 0; ; i++ {
			select {
			case <-stopWriter:
				return
			default:
			}
			resp, err := e.etcd.Put(ctx, fmt.Sprintf("/registry/pods/team-a/w-%d", i%50), podJSON("team-a", fmt.Sprintf("w-%d", i%50), "node-1", i))
			if err != nil {
				return
			}
			lastRV.Store(resp.Header.Revision)
			writes.Add(1)
		}
	}()
	waitWrites := func(n int64) {
		for writes.Load() < n {
			select {
			case <-ctx.Done():
				t.Fatalf("writer stalled at %d writes", writes.Load())
			case <-time.After(10 * time.Millisecond): // polling a counter with a deadline
			}
		}
	}
	// assertDelivered: every existing watcher gets everything written so far.
	assertDelivered := func(phase string) {
		t.Helper()
		rv := lastRV.Load()
		for i, ch := range watchers {
			got := collect(t, ctx, ch, rv)
			for j := 1; j < len(got); j++ {
				if got[j].RV <= got[j-1].RV {
					t.Fatalf("%s: watcher %d: resourceVersion went from %d to %d", phase, i, got[j-1].RV, got[j].RV)
				}
			}
		}
	}

	// 1. Flood: 200 concurrent watch attempts, each on its own HTTP/1.1
	// connection.
	waitWrites(20)
	tr := e.TLSTransport()
	tr.ForceAttemptHTTP2 = false
	tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	tr.MaxConnsPerHost, tr.MaxIdleConnsPerHost = 0, -1
	defer tr.CloseIdleConnections()
	mallory := &http.Client{Transport: bearer{token: "mallory-token", base: tr}}
	floodCtx, stopFlood := context.WithCancel(ctx)
	defer stopFlood()
	var ok, limited atomic.Int64
	var badMu sync.Mutex
	var bad []string
	var wg sync.WaitGroup
	start := time.Now()
	for range attempts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(floodCtx, http.MethodGet, e.FrontdoorURL+"/api/v1/pods?watch=true&resourceVersion=0", nil)
			resp, err := mallory.Do(req)
			if err != nil {
				badMu.Lock()
				bad = append(bad, err.Error())
				badMu.Unlock()
				return
			}
			if resp.StatusCode == http.StatusOK {
				ok.Add(1)
				go func() { io.Copy(io.Discard, resp.Body); resp.Body.Close() }() // held open until stopFlood
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var st statusBody
			json.Unmarshal(b, &st)
			if resp.StatusCode == http.StatusTooManyRequests && st.Reason == "TooManyRequests" && st.Code == 429 && resp.Header.Get("Retry-After") == "1" {
				limited.Add(1)
				return
			}
			badMu.Lock()
			bad = append(bad, fmt.Sprintf("%d %s (Retry-After %q)", resp.StatusCode, b, resp.Header.Get("Retry-After")))
			badMu.Unlock()
		}()
	}
	wg.Wait()
	t.Logf("flood: %d attempts in %s: %d watches opened, %d refused with 429", attempts, time.Since(start).Round(time.Millisecond), ok.Load(), limited.Load())
	if len(bad) > 0 {
		t.Fatalf("flood: %d unexpected answers, first: %s", len(bad), bad[0])
	}
	if ok.Load() != perUser || limited.Load() != attempts-perUser {
		t.Fatalf("flood: %d opened and %d refused, want %d and %d", ok.Load(), limited.Load(), perUser, attempts-perUser)
	}
	// Another user still gets a watch: one client cannot take them all.
	_, aliceCh := openWatchAs(t, ctx, e.client("alice-token", nil), e.FrontdoorURL+"/api/v1/namespaces/team-a/pods?watch=true&resourceVersion=0")
	_ = aliceCh
	waitWrites(writes.Load() + 20)
	assertDelivered("after the flood")

	// 2. Slowloris: 30 connections that never start TLS, 30 that send their
	// headers one line at a time. The server closes each after the
	// read-header timeout (2s).
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.PKI.CAPEM)
	addr := strings.TrimPrefix(e.FrontdoorURL, "https://")
	var closedMax atomic.Int64
	var slowWG sync.WaitGroup
	slowErrs := make(chan error, 60)
	slowStart := time.Now()
	for i := range 60 {
		slowWG.Add(1)
		go func() {
			defer slowWG.Done()
			raw, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				slowErrs <- err
				return
			}
			defer raw.Close()
			var conn net.Conn = raw
			began := time.Now()
			if i%2 == 1 {
				tc := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
				if err := tc.HandshakeContext(ctx); err != nil {
					slowErrs <- fmt.Errorf("handshake: %w", err)
					return
				}
				conn = tc
				go func() { // trickle header lines until the server hangs up
					w := bufio.NewWriter(tc)
					w.WriteString("GET /api/v1/pods HTTP/1.1\r\nHost: frontdoor\r\n")
					for n := 0; ; n++ {
						w.WriteString("X-Slow-" + strconv.Itoa(n) + ": 1\r\n")
						if w.Flush() != nil {
							return
						}
						select {
						case <-ctx.Done():
							return
						case <-time.After(300 * time.Millisecond): // the attack's pace
						}
					}
				}()
			}
			conn.SetReadDeadline(time.Now().Add(15 * time.Second))
			_, err = io.Copy(io.Discard, conn) // until the server closes
			if ne, isNet := err.(net.Error); isNet && ne.Timeout() {
				slowErrs <- fmt.Errorf("slow connection %d still open after 15s", i)
				return
			}
			d := time.Since(began)
			for {
				cur := closedMax.Load()
				if int64(d) <= cur || closedMax.CompareAndSwap(cur, int64(d)) {
					break
				}
			}
		}()
	}
	// While they hang on: a fresh request is served, events keep arriving.
	waitWrites(writes.Load() + 20)
	if code := e.get(t, "/api/v1/namespaces/team-a/pods", &list); code != http.StatusOK {
		t.Fatalf("LIST during slowloris: %d", code)
	}
	assertDelivered("during slowloris")
	slowWG.Wait()
	close(slowErrs)
	for err := range slowErrs {
		t.Error(err)
	}
	t.Logf("slowloris: 60 connections, the last closed by the server after %s (read-header-timeout 2s; whole attack %s)",
		time.Duration(closedMax.Load()).Round(time.Millisecond), time.Since(slowStart).Round(time.Millisecond))
	if d := time.Duration(closedMax.Load()); d > 6*time.Second {
		t.Errorf("a slow connection lived %s, want about the 2s read-header timeout", d)
	}

	close(stopWriter)
	<-writerDone
	assertDelivered("at the end")
	rss1 := rssBytes(t, front.Pid())
	t.Logf("frontdoor RSS: %.1f MiB before the attacks, %.1f MiB after (%d writes delivered to 3 watchers)",
		float64(rss0)/(1<<20), float64(rss1)/(1<<20), writes.Load())
	if rss1-rss0 > 64<<20 {
		t.Errorf("frontdoor RSS grew by %.1f MiB", float64(rss1-rss0)/(1<<20))
	}
	stopFlood()
}

// rssBytes reads a process's resident set size from /proc.
func rssBytes(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

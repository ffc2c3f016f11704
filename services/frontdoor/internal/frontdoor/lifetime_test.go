package frontdoor

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestForwardedStreamLifetime: a forwarded long-running request ends at
// upstream.long-running-timeout: a stream cleanly (the client reads to
// io.EOF, as at the upstream's own end), an upgraded connection closed.
func TestForwardedStreamLifetime(t *testing.T) {
	const lifetime = time.Second
	k := newStreamingKube(t, 0, 100*time.Millisecond)
	s := clusterServer(t, k.srv.URL, k.caPEM(), func(c *Config) {
		c.WriteTimeout = 5 * time.Second // not what is tested here
		c.Upstream.LongRunningTimeout = lifetime
	})
	base := serveTLS(t, s)
	for _, proto := range []string{"HTTP/1.1", "HTTP/2.0"} {
		req, _ := http.NewRequest(http.MethodGet, base+forwardedStreams[1], nil)
		req.Header.Set("Authorization", "Bearer "+tokAdmin)
		start := time.Now()
		resp, err := clientFor(proto).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(start)
		if err != nil || took < lifetime || took > lifetime+5*time.Second || !strings.HasPrefix(string(b), "line 1\nline 2\n") {
			t.Errorf("%s: stream ended after %s (lifetime %s) with %v, %d lines", proto, took, lifetime, err, strings.Count(string(b), "\n"))
		}
		select {
		case <-k.ended:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the upstream request did not end", proto)
		}
	}

	// An upgraded connection (fakeKube echoes) is closed at the lifetime.
	c, err := tls.Dial("tcp", strings.TrimPrefix(base, "https://"), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(15 * time.Second))
	start := time.Now()
	fmt.Fprintf(c, "POST /api/v1/namespaces/ns1/pods/p/exec?command=sh HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n", tokAdmin)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	for i := 0; time.Since(start) < lifetime/2; i++ {
		msg := fmt.Sprintf("ping %d\n", i)
		io.WriteString(c, msg)
		if line, err := br.ReadString('\n'); err != nil || line != msg {
			t.Fatalf("echo: %q %v, want %q", line, err, msg)
		}
	}
	if _, err := br.ReadString('\n'); err != io.EOF || time.Since(start) < lifetime || time.Since(start) > lifetime+5*time.Second {
		t.Errorf("upgraded connection: %v after %s, want io.EOF at the lifetime %s", err, time.Since(start), lifetime)
	}
}

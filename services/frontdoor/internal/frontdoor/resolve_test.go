package frontdoor

import (
	"context"
	"io"
	"log/slog"
	"net/url"
	"testing"
)

// TestFanoutPoolResolvesNames: a fanout URL given by name becomes one
// backend per address it resolves to; URLs given by address stay as they
// are; a refresh keeps the backend (and its load) of an address that
// remains.
func TestFanoutPoolResolvesNames(t *testing.T) {
	p := &fanoutPool{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	p.newBackend = func(u *url.URL) *backend { return &backend{url: u, watches: map[*shedBody]struct{}{}} }
	static, _ := url.Parse("http://10.0.0.9:7200")
	name, _ := url.Parse("http://localhost:7200")
	b := p.newBackend(static)
	b.origin = static
	p.backends = []*backend{b}
	p.names = []*url.URL{name}
	p.refresh(context.Background())
	got := map[string]bool{}
	for _, b := range p.backends {
		got[b.url.Host] = true
	}
	if !got["10.0.0.9:7200"] || !got["127.0.0.1:7200"] {
		t.Fatalf("backends after refresh: %v", got)
	}
	var loopback *backend
	for _, b := range p.backends {
		if b.url.Host == "127.0.0.1:7200" {
			loopback = b
		}
	}
	loopback.open.Store(3)
	p.refresh(context.Background())
	for _, b := range p.backends {
		if b.url.Host == "127.0.0.1:7200" && b.open.Load() != 3 {
			t.Fatal("refresh replaced a backend whose address remained")
		}
	}
}

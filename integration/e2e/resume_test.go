package e2e

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"testing"
	"time"

	"herald.dev/integration/checker"
)

// resumingClient is a watch client that behaves as client-go's reflector
// does: when its stream ends it watches again from the last resourceVersion
// it received (events and bookmarks), and it records everything it saw.
type resumingClient struct {
	mu      sync.Mutex
	events  []checker.WatchEvent
	rv      int64
	n       int
	gone    bool
	changed chan struct{}
}

func (e *env) resumingClient(ctx context.Context, path string, from int64) *resumingClient {
	c := &resumingClient{rv: from, changed: make(chan struct{}, 1)}
	go func() {
		for ctx.Err() == nil {
			c.mu.Lock()
			rv := c.rv
			c.n++
			c.mu.Unlock()
			code, evs := e.openWatch(nopT{}, ctx, path+"&resourceVersion="+strconv.FormatInt(rv, 10))
			if code != 200 {
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
				continue
			}
			for ev := range evs {
				c.mu.Lock()
				switch ev.Type {
				case "ERROR":
					var st status
					json.Unmarshal(ev.Object, &st)
					if st.Code == 410 {
						c.gone = true
					}
				case "BOOKMARK":
					if r, _ := strconv.ParseInt(ev.meta().Metadata.ResourceVersion, 10, 64); r > c.rv {
						c.rv = r
					}
				default:
					we := ev.toCheck()
					c.events = append(c.events, we)
					c.rv = we.RV
				}
				c.mu.Unlock()
				select {
				case c.changed <- struct{}{}:
				default:
				}
			}
		}
	}()
	return c
}

// until waits until the client has reached revision rev and returns what it
// saw.
func (c *resumingClient) until(t *testing.T, ctx context.Context, rev int64) []checker.WatchEvent {
	t.Helper()
	for {
		c.mu.Lock()
		if c.rv >= rev {
			out := append([]checker.WatchEvent(nil), c.events...)
			c.mu.Unlock()
			return out
		}
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			c.mu.Lock()
			defer c.mu.Unlock()
			t.Fatalf("client stuck at revision %d (want %d) after %d events, %d connections", c.rv, rev, len(c.events), c.n)
		case <-c.changed:
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (c *resumingClient) reconnects() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n - 1
}

func (c *resumingClient) expired() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gone
}

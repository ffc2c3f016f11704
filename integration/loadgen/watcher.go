package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"
)

// watcher is one watch stream and what it received. Only its own goroutine
// writes revs and lat until done is closed.
type watcher struct {
	node int // -1: broadcast
	// protobuf asks for application/vnd.kubernetes.protobuf (length-
	// prefixed frames) instead of JSON lines.
	protobuf bool
	revs     []int64
	lat      []int32 // microseconds, one per event of revs
	size     []int32 // bytes of the event's line or frame, one per event of revs
	last     atomic.Int64
	// lastAt is when the last event arrived (Unix nanoseconds).
	lastAt     atomic.Int64
	err        error // why the stream ended before it was cancelled
	openFailed bool
	resumes    int // streams the server closed, resumed from the last revision
	done       chan struct{}
}

var (
	keyType      = []byte(`"type":"`)
	keyRV        = []byte(`"resourceVersion":"`)
	keyWrittenAt = []byte(`"` + WrittenAtAnnotation + `":"`)
)

// open starts the watch and returns once the response headers arrived (the
// server has registered the watcher), retrying 429s until deadline.
func (w *watcher) open(ctx context.Context, c *http.Client, base, token string, rev int64, deadline time.Time) (*http.Response, error) {
	q := url.Values{"watch": {"true"}, "resourceVersion": {fmt.Sprint(rev)}}
	if w.node >= 0 {
		q.Set("fieldSelector", fmt.Sprintf("spec.nodeName=node-%d", w.node))
	}
	u := base + "/api/v1/pods?" + q.Encode()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		if w.protobuf {
			req.Header.Set("Accept", protobufMediaType)
		} else {
			req.Header.Set("Accept", "application/json")
		}
		resp, err := c.Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode == http.StatusOK {
			return resp, nil
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || time.Now().After(deadline) {
			return nil, fmt.Errorf("watch: %s: %s", resp.Status, body)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// run consumes the stream until ctx is cancelled. When the server closes
// it, run resumes from the last revision received, as client-go's
// reflector does, and counts the resume; an ERROR event or a failed resume
// ends it.
func (w *watcher) run(ctx context.Context, c *http.Client, base, token string, rev0 int64, body io.ReadCloser) {
	defer close(w.done)
	for {
		closedByServer := w.read(ctx, body)
		if ctx.Err() != nil || !closedByServer {
			return
		}
		w.resumes++
		from := w.last.Load()
		if from == 0 {
			from = rev0
		}
		resp, err := w.open(ctx, c, base, token, from, time.Now().Add(30*time.Second))
		if err != nil {
			if ctx.Err() == nil {
				w.err = fmt.Errorf("resume from %d: %w", from, err)
			}
			return
		}
		body = resp.Body
	}
}

// read consumes one response body; true means the server ended it without
// an error event (resumable).
func (w *watcher) read(ctx context.Context, body io.ReadCloser) (closedByServer bool) {
	defer body.Close()
	br := bufio.NewReaderSize(body, 4096)
	if w.protobuf {
		return w.readFrames(ctx, br)
	}
	var long []byte
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			long = append(long[:0], line...)
			for err == bufio.ErrBufferFull {
				line, err = br.ReadSlice('\n')
				long = append(long, line...)
			}
			line = long
		}
		if err != nil {
			return ctx.Err() == nil
		}
		if e := w.event(line, time.Now()); e != nil {
			w.err = e
			return false
		}
	}
}

// event picks the type, resourceVersion and write time out of one line.
func (w *watcher) event(line []byte, now time.Time) error {
	i := bytes.Index(line, keyType)
	if i < 0 || i+len(keyType) >= len(line) {
		return fmt.Errorf("not a watch event: %.200s", line)
	}
	switch line[i+len(keyType)] {
	case 'B':
		return nil
	case 'E':
		return fmt.Errorf("ERROR event: %.300s", line)
	}
	rv := number(line, keyRV)
	at := number(line, keyWrittenAt)
	if rv <= 0 || at <= 0 {
		return fmt.Errorf("event without resourceVersion or %s: %.200s", WrittenAtAnnotation, line)
	}
	w.record(rv, at, len(line), now)
	return nil
}

// record notes one delivered event: its revision, its write time (Unix
// nanoseconds) and its size on the wire.
func (w *watcher) record(rv, at int64, size int, now time.Time) {
	w.revs = append(w.revs, rv)
	w.lat = append(w.lat, int32(min((now.UnixNano()-at)/1000, 1<<31-1)))
	w.size = append(w.size, int32(size))
	w.last.Store(rv)
	w.lastAt.Store(now.UnixNano())
}

// number parses the decimal string value that follows key.
func number(line, key []byte) int64 {
	i := bytes.Index(line, key)
	if i < 0 {
		return -1
	}
	var n int64
	for _, c := range line[i+len(key):] {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int64(c-'0')
	}
	return n
}

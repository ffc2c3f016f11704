package loadgen

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// watcherSpec is what one watcher of a workload needs to open its stream:
// its index in the workload, its node (-1: broadcast), the base URL it
// watches through and its bearer token.
type watcherSpec struct {
	I     int    `json:"i"`
	Node  int    `json:"node"`
	URL   string `json:"url"`
	Token string `json:"token"`
}

// watcherSpecs lays out w's watchers on t: watcher i watches node
// i*nodes/w.Watchers (kubelet-like: spread over every node, so that a
// reduced-scale run's watchers see events too) through t.watchURL(i) with
// t.Token(i).
func watcherSpecs(t *Target, w Workload, nodes int) []watcherSpec {
	specs := make([]watcherSpec, w.Watchers)
	for i := range specs {
		node := -1
		if w.Kubelet {
			node = i * nodes / w.Watchers
		}
		specs[i] = watcherSpec{I: i, Node: node, URL: t.watchURL(i), Token: t.Token(i)}
	}
	return specs
}

// watchSet holds a workload's watch streams, in this process (localSet) or
// in child processes (procSet). Watchers are named by their index in the
// workload.
type watchSet interface {
	// open opens watchers from..to-1 and returns once each is open or has
	// failed: how many failed, and the first error.
	open(from, to int) (failed int, firstErr string, err error)
	// drain waits until every watcher still streaming has received the
	// last revision it expects (want(i), 0: none), or until until; it
	// returns when the last event arrived (Unix nanoseconds, 0: none).
	drain(want func(i int) int64, until time.Time) (lastAt int64, err error)
	// close ends every stream and returns each watcher with what it
	// received, by index.
	close() ([]*watcher, error)
	// pids are the child processes holding the watchers: the load
	// client's CPU is theirs too.
	pids() []int
}

// localSet holds its watchers in this process.
type localSet struct {
	specs        []watcherSpec
	ws           []*watcher // by position in specs
	clients      []*http.Client
	closeClients func()
	protobuf     bool
	rev0         int64
	ctx          context.Context
	cancel       context.CancelFunc
	deadline     time.Time // for retrying 429s while opening
}

// newLocalSet prepares specs' watchers of w (not yet open), dialing from
// local (nil: any address) and trusting caFile.
func newLocalSet(ctx context.Context, caFile string, w Workload, specs []watcherSpec, local net.IP, rev0 int64) (*localSet, error) {
	clients, closeClients, err := watchClients(caFile, w, len(specs), local)
	if err != nil {
		return nil, err
	}
	s := &localSet{specs: specs, ws: make([]*watcher, len(specs)), clients: clients, closeClients: closeClients,
		protobuf: w.Protobuf, rev0: rev0, deadline: time.Now().Add(2 * time.Minute)}
	s.ctx, s.cancel = context.WithCancel(ctx)
	return s, nil
}

// open opens the watchers whose index is in [from, to), 64 at a time.
func (s *localSet) open(from, to int) (failed int, firstErr string, err error) {
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for k, sp := range s.specs {
		if sp.I < from || sp.I >= to {
			continue
		}
		x := &watcher{node: sp.Node, protobuf: s.protobuf, done: make(chan struct{})}
		s.ws[k] = x
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			resp, err := x.open(s.ctx, s.clients[k], sp.URL, sp.Token, s.rev0, s.deadline)
			<-sem
			if err != nil {
				mu.Lock()
				failed++
				if firstErr == "" {
					firstErr = err.Error()
				}
				mu.Unlock()
				x.err, x.openFailed = err, true
				close(x.done)
				return
			}
			go x.run(s.ctx, s.clients[k], sp.URL, sp.Token, s.rev0, resp.Body)
		}()
	}
	wg.Wait()
	return failed, firstErr, nil
}

func (s *localSet) drain(want func(i int) int64, until time.Time) (int64, error) {
	for time.Now().Before(until) {
		behind := 0
		for k, x := range s.ws {
			if x == nil {
				continue
			}
			if e := want(s.specs[k].I); e > 0 && x.last.Load() < e && !closed(x.done) {
				behind++
			}
		}
		if behind == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	var lastAt int64
	for _, x := range s.ws {
		if x != nil {
			lastAt = max(lastAt, x.lastAt.Load())
		}
	}
	return lastAt, nil
}

// close cancels every stream, waits for each to end and closes the
// connections; a watcher never opened is left nil.
func (s *localSet) close() ([]*watcher, error) {
	s.cancel()
	for _, x := range s.ws {
		if x != nil {
			<-x.done
		}
	}
	s.closeClients()
	return s.ws, nil
}

func (s *localSet) pids() []int { return nil }

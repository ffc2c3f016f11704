package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// MaxFleetShare is the most watchers one child process of a fleet holds:
// each is a connection, a descriptor in the child and an ephemeral port of
// the child's source address, and a machine may allow a process 20,000
// descriptors and an address about 28,000 ports.
const MaxFleetShare = 15000

// CheckFleet says whether procs child processes can hold watchers (procs
// 0: this process holds them).
func CheckFleet(watchers, procs int) error {
	if procs < 0 || procs > 250 {
		return fmt.Errorf("%d watcher processes: want 0 to 250 (one source address of 127.0.0.2-127.0.0.251 each)", procs)
	}
	if procs > 0 && (watchers+procs-1)/procs > MaxFleetShare {
		return fmt.Errorf("%d watchers over %d processes: more than %d each", watchers, procs, MaxFleetShare)
	}
	return nil
}

// fleetShare is the share of child k of procs: the watchers whose index
// is k modulo procs, so that each half a run opens spreads over every
// child, and a child's watchers over every server (watchURL is round-robin
// too).
func fleetShare(specs []watcherSpec, k, procs int) []watcherSpec {
	var out []watcherSpec
	for _, sp := range specs {
		if sp.I%procs == k {
			out = append(out, sp)
		}
	}
	return out
}

// fleetAddr is the source address child k dials from: 127.0.0.<k+2>, k
// taken modulo 250 (the servers listen on 127.0.0.1, which every address
// of 127.0.0.0/8 reaches).
func fleetAddr(k int) net.IP { return net.IPv4(127, 0, 0, byte(k%250+2)) }

// fleetNext is the first address (fleetAddr) the next fleet's children
// take: each fleet of a run takes the next ones, so that a run's
// connections do not wait for the ports the previous run's closed
// connections hold in TIME_WAIT (a minute) on the same addresses.
var fleetNext atomic.Int64

// The fleet's protocol: the parent writes JSON values to a child's
// standard input, a fleetSetup then fleetRequests, and the child answers
// each with one fleetReply on its standard output. The child ends its
// streams and exits when its standard input closes.
type fleetSetup struct {
	CAFile   string
	Workload Workload
	Local    string // source address
	Rev0     int64
	Specs    []watcherSpec
}

type fleetRequest struct {
	Op       string        // "open", "drain" or "close"
	From, To int           // open
	Want     map[int]int64 `json:",omitempty"` // drain: last revision expected, by watcher
	Until    int64         `json:",omitempty"` // drain: Unix nanoseconds
}

type fleetReply struct {
	Failed   int
	FirstErr string          `json:",omitempty"`
	LastAt   int64           `json:",omitempty"`
	Watchers []watcherRecord `json:",omitempty"`
	Err      string          `json:",omitempty"` // the request failed
}

// watcherRecord is what one watcher received, as a child reports it.
type watcherRecord struct {
	I          int
	Revs       []int64
	Lat, Size  []int32
	Err        string `json:",omitempty"`
	OpenFailed bool   `json:",omitempty"`
	Resumes    int    `json:",omitempty"`
}

func recordOf(i int, x *watcher) watcherRecord {
	r := watcherRecord{I: i, Revs: x.revs, Lat: x.lat, Size: x.size, OpenFailed: x.openFailed, Resumes: x.resumes}
	if x.err != nil {
		r.Err = x.err.Error()
	}
	return r
}

// watcherFrom rebuilds, in the parent, a watcher a child ran: ended, with
// what it received.
func watcherFrom(r watcherRecord, node int) *watcher {
	x := &watcher{node: node, revs: r.Revs, lat: r.Lat, size: r.Size, openFailed: r.OpenFailed, resumes: r.Resumes, done: make(chan struct{})}
	if r.Err != "" {
		x.err = errors.New(r.Err)
	}
	if n := len(r.Revs); n > 0 {
		x.last.Store(r.Revs[n-1])
	}
	close(x.done)
	return x
}

// mergeRecords places the records of every child at their watchers'
// indexes among n; an index no child reported stays nil.
func mergeRecords(n int, specs []watcherSpec, children [][]watcherRecord) ([]*watcher, error) {
	ws := make([]*watcher, n)
	for _, recs := range children {
		for _, r := range recs {
			if r.I < 0 || r.I >= n || ws[r.I] != nil {
				return nil, fmt.Errorf("watcher %d reported twice or out of range", r.I)
			}
			ws[r.I] = watcherFrom(r, specs[r.I].Node)
		}
	}
	return ws, nil
}

// ServeWatchers is a fleet's child: it reads a fleetSetup and then
// requests from in, holds its watchers in this process, and answers on
// out, until in closes.
func ServeWatchers(ctx context.Context, in io.Reader, out io.Writer) error {
	dec, enc := json.NewDecoder(in), json.NewEncoder(out)
	var setup fleetSetup
	if err := dec.Decode(&setup); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	set, err := newLocalSet(ctx, setup.CAFile, setup.Workload, setup.Specs, net.ParseIP(setup.Local), setup.Rev0)
	if err != nil {
		enc.Encode(fleetReply{Err: err.Error()})
		return err
	}
	defer set.close()
	if err := enc.Encode(fleetReply{}); err != nil {
		return err
	}
	for {
		var req fleetRequest
		if err := dec.Decode(&req); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		if err := enc.Encode(serveRequest(set, req)); err != nil {
			return err
		}
	}
}

func serveRequest(set *localSet, req fleetRequest) fleetReply {
	switch req.Op {
	case "open":
		failed, first, _ := set.open(req.From, req.To)
		return fleetReply{Failed: failed, FirstErr: first}
	case "drain":
		lastAt, _ := set.drain(func(i int) int64 { return req.Want[i] }, time.Unix(0, req.Until))
		return fleetReply{LastAt: lastAt}
	case "close":
		ws, _ := set.close()
		var recs []watcherRecord
		for k, x := range ws {
			if x != nil {
				recs = append(recs, recordOf(set.specs[k].I, x))
			}
		}
		return fleetReply{Watchers: recs}
	}
	return fleetReply{Err: fmt.Sprintf("unknown request %q", req.Op)}
}

// fleet holds a workload's watchers in child processes, each from a
// source address of its own (fleetAddr).
type fleet struct {
	specs  []watcherSpec
	procs  []*fleetProc
	closed bool
}

// fleetProc is one child: its standard input and output, and how to wait
// for it to exit (and kill it).
type fleetProc struct {
	pid   int
	wait  func() error
	kill  func() error
	in    io.WriteCloser
	enc   *json.Encoder
	dec   *json.Decoder
	specs []watcherSpec
}

// startFleet starts procs children (argv: this program's watchers
// command), each logging to logDir/watchers-<k>.log, and hands each its
// share of specs.
func startFleet(argv []string, logDir string, procs int, caFile string, w Workload, specs []watcherSpec, rev0 int64) (*fleet, error) {
	if err := CheckFleet(len(specs), procs); err != nil {
		return nil, err
	}
	var ps []*fleetProc
	for k := range procs {
		p, err := startFleetProc(argv, filepath.Join(logDir, fmt.Sprintf("watchers-%d.log", k)))
		if err != nil {
			(&fleet{procs: ps}).stop()
			return nil, err
		}
		ps = append(ps, p)
	}
	first := int(fleetNext.Add(int64(procs))) - procs
	return setupFleet(ps, first, caFile, w, specs, rev0)
}

// setupFleet hands each of procs its share of specs, child k dialing from
// fleetAddr(first+k), and waits until every one is ready.
func setupFleet(procs []*fleetProc, first int, caFile string, w Workload, specs []watcherSpec, rev0 int64) (*fleet, error) {
	f := &fleet{specs: specs, procs: procs}
	for k, p := range procs {
		p.specs = fleetShare(specs, k, len(procs))
		if err := p.enc.Encode(fleetSetup{CAFile: caFile, Workload: w, Local: fleetAddr(first + k).String(), Rev0: rev0, Specs: p.specs}); err != nil {
			f.stop()
			return nil, fmt.Errorf("watchers %d: %w", k, err)
		}
	}
	if _, err := f.each(func(*fleetProc) *fleetRequest { return nil }); err != nil {
		f.stop()
		return nil, err
	}
	return f, nil
}

func startFleetProc(argv []string, logFile string) (*fleetProc, error) {
	if err := os.MkdirAll(filepath.Dir(logFile), 0o755); err != nil {
		return nil, err
	}
	logf, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return newFleetProc(cmd.Process.Pid, in, out, cmd.Wait, cmd.Process.Kill), nil
}

func newFleetProc(pid int, in io.WriteCloser, out io.Reader, wait, kill func() error) *fleetProc {
	return &fleetProc{pid: pid, wait: wait, kill: kill, in: in, enc: json.NewEncoder(in), dec: json.NewDecoder(out)}
}

// each sends every child its request (nil: none, only read a reply) at
// once and returns their replies in order.
func (f *fleet) each(req func(p *fleetProc) *fleetRequest) ([]fleetReply, error) {
	replies := make([]fleetReply, len(f.procs))
	errs := make([]error, len(f.procs))
	var wg sync.WaitGroup
	for k, p := range f.procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r := req(p); r != nil {
				if err := p.enc.Encode(r); err != nil {
					errs[k] = err
					return
				}
			}
			if err := p.dec.Decode(&replies[k]); err != nil {
				errs[k] = err
			} else if replies[k].Err != "" {
				errs[k] = errors.New(replies[k].Err)
			}
		}()
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("watchers %d (pid %d): %w", k, f.procs[k].pid, err)
		}
	}
	return replies, nil
}

func (f *fleet) open(from, to int) (failed int, firstErr string, err error) {
	replies, err := f.each(func(*fleetProc) *fleetRequest { return &fleetRequest{Op: "open", From: from, To: to} })
	for _, r := range replies {
		failed += r.Failed
		if firstErr == "" {
			firstErr = r.FirstErr
		}
	}
	return failed, firstErr, err
}

func (f *fleet) drain(want func(i int) int64, until time.Time) (int64, error) {
	replies, err := f.each(func(p *fleetProc) *fleetRequest {
		m := map[int]int64{}
		for _, sp := range p.specs {
			if e := want(sp.I); e > 0 {
				m[sp.I] = e
			}
		}
		return &fleetRequest{Op: "drain", Want: m, Until: until.UnixNano()}
	})
	var lastAt int64
	for _, r := range replies {
		lastAt = max(lastAt, r.LastAt)
	}
	return lastAt, err
}

// close ends every child's streams, collects what each watcher received
// and stops the children; a second close returns nothing.
func (f *fleet) close() ([]*watcher, error) {
	if f.closed {
		return nil, nil
	}
	replies, err := f.each(func(*fleetProc) *fleetRequest { return &fleetRequest{Op: "close"} })
	f.stop()
	if err != nil {
		return nil, err
	}
	recs := make([][]watcherRecord, len(replies))
	for k, r := range replies {
		recs[k] = r.Watchers
	}
	return mergeRecords(len(f.specs), f.specs, recs)
}

// stop closes every child's standard input and waits for it to exit,
// killing it after 30 s.
func (f *fleet) stop() {
	f.closed = true
	for _, p := range f.procs {
		p.in.Close()
	}
	for _, p := range f.procs {
		done := make(chan struct{})
		go func() { p.wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			p.kill()
			<-done
		}
	}
}

func (f *fleet) pids() []int {
	var out []int
	for _, p := range f.procs {
		out = append(out, p.pid)
	}
	return out
}

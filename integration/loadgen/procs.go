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

// MaxWatchersPerProc is the most watchers one child process of a set holds:
// each is a connection, a descriptor in the child and an ephemeral port of
// the child's source address, and a machine may allow a process 20,000
// descriptors and an address about 28,000 ports.
const MaxWatchersPerProc = 15000

// CheckWatcherProcs says whether procs child processes can hold watchers (procs
// 0: this process holds them).
func CheckWatcherProcs(watchers, procs int) error {
	if procs < 0 || procs > 250 {
		return fmt.Errorf("%d watcher processes: want 0 to 250 (one source address of 127.0.0.2-127.0.0.251 each)", procs)
	}
	if procs > 0 && (watchers+procs-1)/procs > MaxWatchersPerProc {
		return fmt.Errorf("%d watchers over %d processes: more than %d each", watchers, procs, MaxWatchersPerProc)
	}
	return nil
}

// procShare is the share of child k of procs: the watchers whose index
// is k modulo procs, so that each half a run opens spreads over every
// child, and a child's watchers over every server (watchURL is round-robin
// too).
func procShare(specs []watcherSpec, k, procs int) []watcherSpec {
	var out []watcherSpec
	for _, sp := range specs {
		if sp.I%procs == k {
			out = append(out, sp)
		}
	}
	return out
}

// procAddr is the source address child k dials from: 127.0.0.<k+2>, k
// taken modulo 250 (the servers listen on 127.0.0.1, which every address
// of 127.0.0.0/8 reaches).
func procAddr(k int) net.IP { return net.IPv4(127, 0, 0, byte(k%250+2)) }

// procAddrNext is the first address (procAddr) the next set's children
// take: each set of a run takes the next ones, so that a run's
// connections do not wait for the ports the previous run's closed
// connections hold in TIME_WAIT (a minute) on the same addresses.
var procAddrNext atomic.Int64

// The watcher processes' protocol: the parent writes JSON values to a child's
// standard input, a procSetup then procRequests, and the child answers
// each with one procReply on its standard output. The child ends its
// streams and exits when its standard input closes.
type procSetup struct {
	CAFile   string
	Workload Workload
	Local    string // source address
	Rev0     int64
	Specs    []watcherSpec
}

type procRequest struct {
	Op       string        // "open", "drain" or "close"
	From, To int           // open
	Want     map[int]int64 `json:",omitempty"` // drain: last revision expected, by watcher
	Until    int64         `json:",omitempty"` // drain: Unix nanoseconds
}

type procReply struct {
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

// ServeWatchers is a child of a set of watcher processes: it reads a procSetup and then
// requests from in, holds its watchers in this process, and answers on
// out, until in closes.
func ServeWatchers(ctx context.Context, in io.Reader, out io.Writer) error {
	dec, enc := json.NewDecoder(in), json.NewEncoder(out)
	var setup procSetup
	if err := dec.Decode(&setup); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	set, err := newLocalSet(ctx, setup.CAFile, setup.Workload, setup.Specs, net.ParseIP(setup.Local), setup.Rev0)
	if err != nil {
		enc.Encode(procReply{Err: err.Error()})
		return err
	}
	defer set.close()
	if err := enc.Encode(procReply{}); err != nil {
		return err
	}
	for {
		var req procRequest
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

func serveRequest(set *localSet, req procRequest) procReply {
	switch req.Op {
	case "open":
		failed, first, _ := set.open(req.From, req.To)
		return procReply{Failed: failed, FirstErr: first}
	case "drain":
		lastAt, _ := set.drain(func(i int) int64 { return req.Want[i] }, time.Unix(0, req.Until))
		return procReply{LastAt: lastAt}
	case "close":
		ws, _ := set.close()
		var recs []watcherRecord
		for k, x := range ws {
			if x != nil {
				recs = append(recs, recordOf(set.specs[k].I, x))
			}
		}
		return procReply{Watchers: recs}
	}
	return procReply{Err: fmt.Sprintf("unknown request %q", req.Op)}
}

// procSet holds a workload's watchers in child processes, each from a
// source address of its own (procAddr).
type procSet struct {
	specs  []watcherSpec
	procs  []*watcherProc
	closed bool
}

// watcherProc is one child: its standard input and output, and how to wait
// for it to exit (and kill it).
type watcherProc struct {
	pid   int
	wait  func() error
	kill  func() error
	in    io.WriteCloser
	enc   *json.Encoder
	dec   *json.Decoder
	specs []watcherSpec
}

// startWatcherProcs starts procs children (argv: this program's watchers
// command), each logging to logDir/watchers-<k>.log, and hands each its
// share of specs.
func startWatcherProcs(argv []string, logDir string, procs int, caFile string, w Workload, specs []watcherSpec, rev0 int64) (*procSet, error) {
	if err := CheckWatcherProcs(len(specs), procs); err != nil {
		return nil, err
	}
	var ps []*watcherProc
	for k := range procs {
		p, err := startWatcherProc(argv, filepath.Join(logDir, fmt.Sprintf("watchers-%d.log", k)))
		if err != nil {
			(&procSet{procs: ps}).stop()
			return nil, err
		}
		ps = append(ps, p)
	}
	first := int(procAddrNext.Add(int64(procs))) - procs
	return setupWatcherProcs(ps, first, caFile, w, specs, rev0)
}

// setupWatcherProcs hands each of procs its share of specs, child k dialing from
// procAddr(first+k), and waits until every one is ready.
func setupWatcherProcs(procs []*watcherProc, first int, caFile string, w Workload, specs []watcherSpec, rev0 int64) (*procSet, error) {
	f := &procSet{specs: specs, procs: procs}
	for k, p := range procs {
		p.specs = procShare(specs, k, len(procs))
		if err := p.enc.Encode(procSetup{CAFile: caFile, Workload: w, Local: procAddr(first + k).String(), Rev0: rev0, Specs: p.specs}); err != nil {
			f.stop()
			return nil, fmt.Errorf("watchers %d: %w", k, err)
		}
	}
	if _, err := f.each(func(*watcherProc) *procRequest { return nil }); err != nil {
		f.stop()
		return nil, err
	}
	return f, nil
}

func startWatcherProc(argv []string, logFile string) (*watcherProc, error) {
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
	return newWatcherProc(cmd.Process.Pid, in, out, cmd.Wait, cmd.Process.Kill), nil
}

func newWatcherProc(pid int, in io.WriteCloser, out io.Reader, wait, kill func() error) *watcherProc {
	return &watcherProc{pid: pid, wait: wait, kill: kill, in: in, enc: json.NewEncoder(in), dec: json.NewDecoder(out)}
}

// each sends every child its request (nil: none, only read a reply) at
// once and returns their replies in order.
func (f *procSet) each(req func(p *watcherProc) *procRequest) ([]procReply, error) {
	replies := make([]procReply, len(f.procs))
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

func (f *procSet) open(from, to int) (failed int, firstErr string, err error) {
	replies, err := f.each(func(*watcherProc) *procRequest { return &procRequest{Op: "open", From: from, To: to} })
	for _, r := range replies {
		failed += r.Failed
		if firstErr == "" {
			firstErr = r.FirstErr
		}
	}
	return failed, firstErr, err
}

func (f *procSet) drain(want func(i int) int64, until time.Time) (int64, error) {
	replies, err := f.each(func(p *watcherProc) *procRequest {
		m := map[int]int64{}
		for _, sp := range p.specs {
			if e := want(sp.I); e > 0 {
				m[sp.I] = e
			}
		}
		return &procRequest{Op: "drain", Want: m, Until: until.UnixNano()}
	})
	var lastAt int64
	for _, r := range replies {
		lastAt = max(lastAt, r.LastAt)
	}
	return lastAt, err
}

// close ends every child's streams, collects what each watcher received
// and stops the children; a second close returns nothing.
func (f *procSet) close() ([]*watcher, error) {
	if f.closed {
		return nil, nil
	}
	replies, err := f.each(func(*watcherProc) *procRequest { return &procRequest{Op: "close"} })
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
func (f *procSet) stop() {
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

func (f *procSet) pids() []int {
	var out []int
	for _, p := range f.procs {
		out = append(out, p.pid)
	}
	return out
}

package service

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// A process's Ps (GOMAXPROCS) follow its load: all of them (Go's default)
// while it is busy, one while it is quiet. With more than one P, every
// hand-off between goroutines (a socket's reader to the loop that applies
// what it read, that loop to a writer) wakes an idle thread to look for
// work; in a process that uses a fraction of a core, as cache, fanout and
// frontdoor do while their watches are quiet (a kubelet's gets an event
// every 25 s), that waking is about a fifth of the process's CPU
// (docs/operations.md, "Cores"). One P saves it, but one P also makes a busy
// process's bursts (a paced write to every busy watch at once) queue behind
// each other; so the process drops to one P only after a while of little
// use, and gets every P back as soon as one P is mostly busy.

// ProcsConfig is whether a process adapts its Ps to its load (procs.adapt).
type ProcsConfig struct {
	Adapt bool
}

func (c *ProcsConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.Adapt, "procs.adapt", true, "Run on one P (GOMAXPROCS=1) while the process uses less than a quarter of a core for 5s, and on all of them (Go's default) again once one P is busy for more than 40% of 200ms: a quiet process then spares the scheduler waking idle threads at every hand-off, a busy one keeps every core. A GOMAXPROCS set in the environment, or a default of one, turns it off.")
}

// procsPolicy decides a process's Ps from its CPU use, one tick at a time.
// It is pure: tests drive it with figures.
type procsPolicy struct {
	max int // the Ps of a busy process (Go's default)
	// up: a tick's use, in cores, that one P must reach upTicks ticks in a
	// row to get max Ps back; down: the use max Ps must stay under for
	// downTicks ticks in a row to drop to one.
	up, down           float64
	upTicks, downTicks int

	over, under int // consecutive ticks above up (at one P), under down (at max)
}

func newProcsPolicy(max int, tick time.Duration) *procsPolicy {
	return &procsPolicy{max: max, up: 0.4, down: 0.25,
		upTicks: ticksIn(200*time.Millisecond, tick), downTicks: ticksIn(5*time.Second, tick)}
}

func ticksIn(d, tick time.Duration) int { return max(1, int(d/tick)) }

// next is the Ps for the next tick, given the current ones and the cores
// the process used during the tick that ended.
func (p *procsPolicy) next(cur int, used float64) int {
	if cur < p.max {
		p.under = 0
		if used < p.up {
			p.over = 0
			return cur
		}
		if p.over++; p.over < p.upTicks {
			return cur
		}
		p.over = 0
		return p.max
	}
	p.over = 0
	if used >= p.down {
		p.under = 0
		return cur
	}
	if p.under++; p.under < p.downTicks {
		return cur
	}
	p.under = 0
	return 1
}

// procsTick is how often the process's CPU use is read (one getrusage).
const procsTick = 100 * time.Millisecond

// adaptProcs runs the policy until ctx ends, then gives the process its max
// Ps back. It does nothing when the environment sets GOMAXPROCS or the
// process has a single P anyway (ingest, a 1-CPU machine).
func (c *ProcsConfig) adaptProcs(ctx context.Context, log *slog.Logger) {
	if !c.Adapt {
		return
	}
	if n, err := strconv.Atoi(os.Getenv("GOMAXPROCS")); err == nil && n > 0 {
		return
	}
	max := runtime.GOMAXPROCS(0)
	if max <= 1 {
		return
	}
	go func() {
		pol := newProcsPolicy(max, procsTick)
		cur := max
		defer runtime.GOMAXPROCS(max)
		t := time.NewTicker(procsTick)
		defer t.Stop()
		last, lastAt := cpuTime(), time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				used := cpuTime()
				cores := (used - last).Seconds() / now.Sub(lastAt).Seconds()
				last, lastAt = used, now
				if n := pol.next(cur, cores); n != cur {
					runtime.GOMAXPROCS(n)
					log.Debug("Ps adapted to the process's load", "from", cur, "to", n, "cores", cores)
					cur = n
				}
			}
		}
	}()
}

// cpuTime is the user and system CPU the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

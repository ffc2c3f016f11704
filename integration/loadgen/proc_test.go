package loadgen

import (
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// WriteCalls counts this process's own writes: 100 writes to a pipe raise
// it by at least 100 (the runtime may write too, never less).
func TestWriteCallsCountsWrites(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	go func() {
		buf := make([]byte, 64)
		for {
			if _, err := r.Read(buf); err != nil {
				return
			}
		}
	}()
	before, err := WriteCalls(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if _, err := w.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	after, err := WriteCalls(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if got := after - before; got < 100 {
		t.Fatalf("write system calls rose by %v after 100 writes, want at least 100", got)
	}
	if _, err := WriteCalls(-1); err == nil {
		t.Fatal("WriteCalls(-1): no error, want one for a process that does not exist")
	}
}

// RSSBytes reads this process's resident set, which holds at least the
// test binary.
func TestRSSBytes(t *testing.T) {
	rss, err := RSSBytes(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if rss < 1<<20 {
		t.Fatalf("RSS %d bytes, want at least 1 MiB", rss)
	}
}

// ReadSched sums this process's threads: a goroutine that sleeps on its
// own thread puts that thread on a CPU again when it wakes, so the count
// grows. (The thread is given back, not ended: an ended thread's figures
// leave the sum.)
func TestReadSched(t *testing.T) {
	before, err := ReadSched(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer close(done)
		for range 1000 {
			runtime.Gosched()
			syscall.Getpid()
		}
		time.Sleep(time.Millisecond) // leaves the CPU: one more slice
	}()
	<-done
	after, err := ReadSched(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after.Slices <= before.Slices || after.Wait < 0 {
		t.Fatalf("schedstat went from %+v to %+v, want more slices", before, after)
	}
	if _, err := ReadSched(-1); err == nil {
		t.Fatal("ReadSched(-1): no error, want one for a process that does not exist")
	}
}

func TestParseSchedstat(t *testing.T) {
	s, err := parseSchedstat([]byte("123456789 2500000 42\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.run != 123456789 || s.Wait != 2500*time.Microsecond || s.Slices != 42 {
		t.Fatalf("got %+v, want 123.456789ms on a CPU, a wait of 2.5ms and 42 slices", s)
	}
	for _, bad := range []string{"", "1 2", "1 x 3", "1 2 3 4"} {
		if _, err := parseSchedstat([]byte(bad)); err == nil {
			t.Errorf("parseSchedstat(%q): no error", bad)
		}
	}
}

func TestStealShare(t *testing.T) {
	m0, err := parseStat([]byte("cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 50 0 25 400 5 0 2 18 0 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	m1, err := parseStat([]byte("cpu  160 0 70 900 10 0 5 55 7 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	// 200 ticks passed (the guest column is already in user), 20 stolen.
	if got := StealShare(m0, m1); m0.Total != 1000 || got != 0.1 {
		t.Fatalf("total %v, steal share %v: want 1000 and 0.1", m0.Total, got)
	}
	if got := StealShare(m1, m1); got != -1 {
		t.Fatalf("steal share over no time: %v, want -1", got)
	}
	for _, bad := range []string{"", "intr 1 2 3", "cpu 1 2 3"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q): no error", bad)
		}
	}
	if _, err := ReadMachineTicks(); err != nil {
		t.Fatal(err)
	}
}

package loadgen

import (
	"os"
	"testing"
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

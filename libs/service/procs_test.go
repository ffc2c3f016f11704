package service

import (
	"testing"
	"time"
)

func TestProcsPolicy(t *testing.T) {
	pol := newProcsPolicy(4, 100*time.Millisecond) // up after 2 ticks >= 0.4, down after 50 ticks < 0.25
	cur := 4
	run := func(used float64, ticks int) []int {
		var seen []int
		for range ticks {
			n := pol.next(cur, used)
			if n != cur {
				seen = append(seen, n)
			}
			cur = n
		}
		return seen
	}
	steps := []struct {
		name  string
		used  float64
		ticks int
		want  []int // the changes, in order
	}{
		{"busy at max stays", 1.5, 100, nil},
		{"quiet for less than 5s stays", 0.1, 49, nil},
		{"one busy tick restarts the quiet count", 0.3, 1, nil},
		{"49 more quiet ticks", 0.1, 49, nil},
		{"the 50th quiet tick in a row drops to one", 0.1, 1, []int{1}},
		{"quiet at one stays", 0.2, 200, nil},
		{"a single busy tick at one stays", 0.9, 1, nil},
		{"then a quiet one restarts the count", 0.1, 1, nil},
		{"two busy ticks in a row get every P back", 0.4, 2, []int{4}},
		{"and half a core keeps them", 0.3, 100, nil},
		{"quiet again: one after 5s", 0.0, 50, []int{1}},
	}
	for _, s := range steps {
		if got := run(s.used, s.ticks); !equalInts(got, s.want) {
			t.Fatalf("%s: changes %v, want %v", s.name, got, s.want)
		}
	}
}

func TestProcsPolicyTicks(t *testing.T) {
	pol := newProcsPolicy(2, 10*time.Second) // a tick longer than both windows: one tick each
	if n := pol.next(2, 0); n != 1 {
		t.Fatalf("down after one quiet 10s tick: %d, want 1", n)
	}
	if n := pol.next(1, 0.5); n != 2 {
		t.Fatalf("up after one busy 10s tick: %d, want 2", n)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

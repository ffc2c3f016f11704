package limits

import "testing"

func TestLimiterFairShare(t *testing.T) {
	l := New(8, 8)
	for i := range 6 {
		if _, r := l.Acquire("hog"); r != "" {
			t.Fatalf("hog slot %d refused: %s", i, r)
		}
	}
	// 6 of 8 taken: contended; the hog holds more than a fair share.
	if _, r := l.Acquire("hog"); r != Fair {
		t.Fatalf("hog beyond its fair share: %q, want %q", r, Fair)
	}
	if _, r := l.Acquire("newcomer"); r != "" {
		t.Fatalf("newcomer refused: %s", r)
	}
	if _, r := l.Acquire("other"); r != "" {
		t.Fatalf("other refused: %s", r)
	}
	if _, r := l.Acquire("third"); r != Total {
		t.Fatalf("full pool: %q, want %q", r, Total)
	}
}

package service

import (
	"errors"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestReloadableKeepsLastGood: a change that fails to load keeps the last
// good value, is counted and reported by Err until a later change loads.
func TestReloadableKeepsLastGood(t *testing.T) {
	path := filepath.Join(t.TempDir(), "value")
	write := func(s string, age time.Duration) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		// A distinct mtime for every version, even within the clock's
		// resolution.
		mt := time.Now().Add(-age)
		os.Chtimes(path, mt, mt)
	}
	write("one", 3*time.Second)
	r, err := NewReloadable("value", StaticFiles(path), func() (*string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		if strings.HasPrefix(string(b), "bad") {
			return nil, errors.New("does not parse")
		}
		s := string(b)
		return &s, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "reloads"}, []string{"what", "result"})
	log := slog.New(slog.DiscardHandler)
	if r.Check(log, reloads) || r.Err() != nil || r.Name() != "value" {
		t.Fatalf("unchanged: reloaded, or Err %v", r.Err())
	}
	write("bad!", 2*time.Second)
	if r.Check(log, reloads) || *r.Get() != "one" || r.Err() == nil {
		t.Fatalf("broken change: value %q, Err %v; want the last good one and an error", *r.Get(), r.Err())
	}
	if r.Check(log, reloads) || r.Err() == nil {
		t.Fatalf("broken file unchanged: Err %v, want still failing", r.Err())
	}
	if n := testutil.ToFloat64(reloads.WithLabelValues("value", "error")); n != 1 {
		t.Fatalf("errors counted: %v, want 1", n)
	}
	write("two", time.Second)
	if !r.Check(log, reloads) || *r.Get() != "two" || r.Err() != nil {
		t.Fatalf("fixed: value %q, Err %v", *r.Get(), r.Err())
	}
}

// TestReadyDetail: a detail shows on /readyz without failing it.
func TestReadyDetail(t *testing.T) {
	a := NewAdmin()
	a.AddReadyCheck("up", func() error { return nil })
	var failing error
	a.AddReadyDetail("config-files", func() error { return failing })
	if code, body := get(t, a, "/readyz"); code != 200 || strings.Contains(body, "config-files") {
		t.Fatalf("no warning: %d %s", code, body)
	}
	failing = errors.New("token file: serving the last good one")
	if code, body := get(t, a, "/readyz"); code != 200 || !strings.Contains(body, "[!]config-files warning: token file: serving the last good one") {
		t.Fatalf("warning: %d %s", code, body)
	}
}

func get(t *testing.T, a *Admin, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	a.mux.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	return rec.Code, rec.Body.String()
}

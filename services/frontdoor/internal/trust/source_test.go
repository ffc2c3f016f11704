package trust

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"herald.dev/libs/service"
)

// A source fails closed: a change that does not load serves none() and
// says why; one that loads again restores the trust.
func TestSourceFailsClosed(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	write := func(s string) {
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	load := func() (*string, error) {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		if string(b) == "broken" {
			return nil, errors.New("bad file")
		}
		v := string(b)
		return &v, nil
	}
	none := func() *string { v := ""; return &v }
	write("broken")
	if _, err := New("f", "nothing", service.StaticFiles(p), load, none); err == nil {
		t.Fatal("a source that does not load at start was accepted")
	}
	write("one")
	src, err := New("f", "nothing", service.StaticFiles(p), load, none)
	if err != nil || *src.Get() != "one" || src.Err() != nil {
		t.Fatalf("start: %v %v", err, src.Err())
	}
	log := slog.New(slog.DiscardHandler)
	if src.Check(log, nil) {
		t.Fatal("unchanged file reported as changed")
	}
	write("broken")
	if !src.Check(log, nil) || *src.Get() != "" || src.Err() == nil || src.RefusedWhileBroken() != "nothing" {
		t.Fatalf("broken: %q, err %v", *src.Get(), src.Err())
	}
	write("three")
	if !src.Check(log, nil) || *src.Get() != "three" || src.Err() != nil {
		t.Fatalf("repaired: %q, err %v", *src.Get(), src.Err())
	}
	os.Remove(p)
	if !src.Check(log, nil) || *src.Get() != "" || src.Err() == nil {
		t.Fatalf("deleted: %q, err %v", *src.Get(), src.Err())
	}
}

func TestManifestFiles(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"b.yaml", "a.json", "c.YML", ".hidden.yaml", "notes.txt"} {
		os.WriteFile(filepath.Join(dir, n), nil, 0o600)
	}
	os.Mkdir(filepath.Join(dir, "..data"), 0o700)
	got, err := ManifestFiles(dir)()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a.json", "b.yaml", "c.YML"}
	if len(got) != len(want) {
		t.Fatalf("%v", got)
	}
	for i := range want {
		if got[i] != filepath.Join(dir, want[i]) {
			t.Fatalf("%v, want %v", got, want)
		}
	}
}

package authn

import (
	"testing"
	"time"
)

func TestKnownTokens(t *testing.T) {
	k := newKnownTokens()
	now := time.Now()
	k.now = func() time.Time { return now }
	k.add("a")
	if !k.has("a") || k.has("b") {
		t.Fatal("has")
	}
	now = now.Add(knownTokenRetention)
	if k.has("a") {
		t.Error("a token past the retention is still known")
	}
	k.add("b")
	k.forget("b")
	if k.has("b") {
		t.Error("a forgotten token is known")
	}
}

package rv

import (
	"encoding/base64"
	"testing"
)

// TestInconsistentToken: the token answered for a compacted one continues
// after the same key at the latest state, written as kube-apiserver
// writes it (revision -1), and reads back as a token without revision.
func TestInconsistentToken(t *testing.T) {
	const prefix = "/registry/podtemplates/ns/"
	tok := After(prefix+"template-0039", 812)
	in := tok.Inconsistent()
	if in.Rev != 0 || in.Start != tok.Start {
		t.Fatalf("Inconsistent() = %+v, want the start %q at no revision", in, tok.Start)
	}
	wire := in.Encode(prefix)
	b, err := base64.RawURLEncoding.DecodeString(wire)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), `{"v":"meta.k8s.io/v1","rv":-1,"start":"/template-0039\u0000"}`; got != want {
		t.Errorf("wire %s, want %s", got, want)
	}
	back, err := DecodeToken(wire, prefix)
	if err != nil || back != in {
		t.Errorf("DecodeToken = %+v, %v; want %+v", back, err, in)
	}
}

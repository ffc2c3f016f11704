package rv

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path"
	"strings"
)

// Continue tokens are kube-apiserver's (k8s.io/apiserver's storage
// EncodeContinue and DecodeContinue): base64url (unpadded) of
// {"v":"meta.k8s.io/v1","rv":<revision>,"start":<key>}, where the key is the
// one the next page starts at, relative to the list's key prefix (the last
// key served and a NUL byte; kube-apiserver's watch cache writes it with a
// leading "/", its etcd storage without, and both read both). So a list
// Herald started can go on at kube-apiserver, and one kube-apiserver started
// at Herald, as between two kube-apiservers.

// tokenVersion is the only version kube-apiserver reads.
const tokenVersion = "meta.k8s.io/v1"

// maxTokenLen bounds the work spent on a client's token. Keys are at most a
// few hundred bytes; anything far larger is not a token.
const maxTokenLen = 4096

// Token is the decoded content of a continue token.
type Token struct {
	// Rev is the list's revision; 0 for a token that asks for the latest
	// state (kube-apiserver's tokens with a negative revision).
	Rev int64
	// Start is the key the next page starts at (included).
	Start string
}

// After returns the token that continues a list after key at rev.
func After(key string, rev int64) Token { return Token{Rev: rev, Start: key + "\x00"} }

type tokenWire struct {
	V     string `json:"v"`
	Rev   int64  `json:"rv"`
	Start string `json:"start"`
}

// Encode returns the token a client sends back as continue, for a list of
// the keys under prefix (a resource's or a namespace's, ending in "/").
func (t Token) Encode(prefix string) string {
	rev := t.Rev
	if rev == 0 {
		rev = -1 // the latest state, as kube-apiserver reads it
	}
	// Relative to the prefix without its slash, as kube-apiserver's watch
	// cache writes it ("/name\x00"; its etcd reads leave the slash out,
	// and both read either). The prefix itself is "/".
	start := strings.TrimPrefix(t.Start, strings.TrimSuffix(prefix, "/"))
	b, _ := json.Marshal(tokenWire{V: tokenVersion, Rev: rev, Start: start})
	return base64.RawURLEncoding.EncodeToString(b)
}

// TokenError is a continue token that cannot be read; its text is
// kube-apiserver's for the same token.
type TokenError struct{ msg string }

func (e *TokenError) Error() string { return e.msg }

// Is makes a TokenError an ErrMalformed.
func (e *TokenError) Is(target error) bool { return target == ErrMalformed }

func tokenError(format string, a ...any) error {
	return &TokenError{msg: "continue key is not valid" + fmt.Sprintf(format, a...)}
}

// DecodeToken reads a continue token of a list of the keys under prefix, as
// kube-apiserver does: its start key may not leave prefix.
func DecodeToken(s, prefix string) (Token, error) {
	if len(s) > maxTokenLen {
		return Token{}, tokenError(": too long")
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return Token{}, tokenError(": %v", err)
	}
	var w tokenWire
	if err := json.Unmarshal(b, &w); err != nil {
		return Token{}, tokenError(": %v", err)
	}
	if w.V != tokenVersion {
		return Token{}, tokenError(": server does not recognize this encoded version %v", w.V)
	}
	if w.Rev == 0 {
		return Token{}, tokenError(": incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
	}
	if w.Start == "" {
		return Token{}, tokenError(": encoded start key empty (version meta.k8s.io/v1)")
	}
	// A start key that path.Clean would change could climb out of prefix.
	key := w.Start
	if !strings.HasPrefix(key, "/") {
		key = "/" + key
	}
	if path.Clean(key) != key {
		return Token{}, tokenError(": %v", w.Start)
	}
	return Token{Rev: max(w.Rev, 0), Start: prefix + key[1:]}, nil
}

// Inconsistent returns the token kube-apiserver answers a continued list
// with when etcd has compacted the token's revision (its etcd storage's
// GetList on ErrCompacted): the same start key at the latest state
// (revision -1 on the wire). The pages it continues with are read at a
// newer revision than the first: objects changed meanwhile may show up.
func (t Token) Inconsistent() Token { return Token{Start: t.Start} }

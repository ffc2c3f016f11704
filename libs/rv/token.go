package rv

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
)

// tokenVersion guards against tokens of another format (or another
// server): a token carries it and a different one is rejected as malformed.
const tokenVersion = "herald/v1"

// maxTokenLen bounds the work spent on a client's token. Keys are at most a
// few hundred bytes; anything far larger is not ours.
const maxTokenLen = 4096

// Token is the decoded content of a continue token: the list's revision
// and the key after which the next page starts.
type Token struct {
	Rev int64
	// After is the last key served on the previous page; the next page
	// starts strictly after it.
	After string
}

type tokenWire struct {
	V     string `json:"v"`
	Rev   int64  `json:"rv"`
	After string `json:"after"`
}

// Encode returns the opaque token a client sends back as continue.
func (t Token) Encode() string {
	b, _ := json.Marshal(tokenWire{V: tokenVersion, Rev: t.Rev, After: t.After})
	return base64.RawURLEncoding.EncodeToString(b)
}

// DecodeToken validates and decodes a continue token. Anything that Encode
// did not produce is ErrMalformed.
func DecodeToken(s string) (Token, error) {
	if len(s) > maxTokenLen {
		return Token{}, fmt.Errorf("%w: continue token is too long", ErrMalformed)
	}
	// Accept padded base64 too: some clients re-encode what they receive.
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
	if err != nil {
		return Token{}, fmt.Errorf("%w: continue token is not valid: not base64", ErrMalformed)
	}
	var w tokenWire
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil || dec.More() || dec.InputOffset() != int64(len(b)) {
		return Token{}, fmt.Errorf("%w: continue token is not valid: not a Herald token", ErrMalformed)
	}
	if w.V != tokenVersion {
		return Token{}, fmt.Errorf("%w: continue token is not valid: unknown version %q", ErrMalformed, w.V)
	}
	if w.Rev <= 0 {
		return Token{}, fmt.Errorf("%w: continue token is not valid: bad revision", ErrMalformed)
	}
	if w.After == "" || !strings.HasPrefix(w.After, "/") || strings.Contains(w.After, "/../") {
		return Token{}, fmt.Errorf("%w: continue token is not valid: bad key", ErrMalformed)
	}
	return Token{Rev: w.Rev, After: w.After}, nil
}

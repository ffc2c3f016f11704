package frontdoor

import (
	"crypto/sha256"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
)

// User is an authenticated identity.
type User struct {
	Name   string
	UID    string
	Groups []string
}

// tokenAuth authenticates bearer tokens from a static token file.
type tokenAuth struct {
	// Keyed by the token's SHA-256: a lookup's timing can only tell an
	// attacker about hashes, never about a token's prefix.
	users map[[32]byte]User
}

func loadTokens(path string) (*tokenAuth, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.FieldsPerRecord = -1
	r.TrimLeadingSpace = true
	r.Comment = '#'
	a := &tokenAuth{users: map[[32]byte]User{}}
	for line := 1; ; line++ {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("token file %s: %w", path, err)
		}
		if len(rec) < 2 || rec[0] == "" || rec[1] == "" {
			return nil, fmt.Errorf("token file %s: record %d needs at least token,user", path, line)
		}
		u := User{Name: rec[1]}
		if len(rec) > 2 {
			u.UID = rec[2]
		}
		if len(rec) > 3 && rec[3] != "" {
			for _, g := range strings.Split(rec[3], ",") {
				if g = strings.TrimSpace(g); g != "" {
					u.Groups = append(u.Groups, g)
				}
			}
		}
		a.users[sha256.Sum256([]byte(rec[0]))] = u
	}
	if len(a.users) == 0 {
		return nil, fmt.Errorf("token file %s has no tokens", path)
	}
	return a, nil
}

// authenticate returns the user of r's bearer token; ok is false when there
// is no valid token.
func (a *tokenAuth) authenticate(r *http.Request) (User, bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, found := strings.Cut(h, " ")
	if !found || !strings.EqualFold(scheme, "bearer") {
		return User{}, false
	}
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return User{}, false
	}
	u, ok := a.users[sha256.Sum256([]byte(tok))]
	return u, ok
}

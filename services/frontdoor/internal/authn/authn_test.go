package authn

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"

	"herald.dev/libs/service"
	"herald.dev/services/frontdoor/internal/trust"
)

// The authenticator alone, on a static token file: the union's rules
// (valid credentials win, invalid ones are a 401 even with anonymous
// access on, none is anonymous or ErrNoCredentials).
func TestAuthenticatorTokens(t *testing.T) {
	p := filepath.Join(t.TempDir(), "tokens.csv")
	if err := os.WriteFile(p, []byte("# comment\ntok-a,alice,1,\"g1,g2\"\ntok-b,bob\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens, err := trust.New("token file", "its tokens are refused", service.StaticFiles(p),
		func() (*TokenFile, error) { return LoadTokens(p) }, NoTokens)
	if err != nil {
		t.Fatal(err)
	}
	a := &Authenticator{Tokens: tokens, Now: time.Now}
	req := func(auth string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/api", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		return r
	}
	u, err := a.Authenticate(req("Bearer tok-a"))
	if err != nil || u.Name != "alice" || u.UID != "1" || u.Method != "token" || !sets.NewString(u.Groups...).Equal(sets.NewString("g1", "g2", "system:authenticated")) {
		t.Fatalf("alice: %+v %v", u, err)
	}
	// The file's groups are not shared with the user returned.
	u.Groups[0] = "system:masters"
	if u, _ := a.Authenticate(req("bearer  tok-a ")); u == nil || slices.Contains(u.Groups, "system:masters") {
		t.Fatalf("alice again: %+v", u)
	}
	if _, err := a.Authenticate(req("Bearer nope")); err == nil || errors.Is(err, ErrNoCredentials) {
		t.Fatalf("unknown token: %v", err)
	}
	for _, h := range []string{"", "Basic dTpw", "Bearer "} {
		if _, err := a.Authenticate(req(h)); !errors.Is(err, ErrNoCredentials) {
			t.Fatalf("%q: %v, want ErrNoCredentials", h, err)
		}
	}
	a.Anonymous = true
	if u, err := a.Authenticate(req("")); err != nil || u.Name != "system:anonymous" || !slices.Equal(u.Groups, []string{"system:unauthenticated"}) {
		t.Fatalf("anonymous: %+v %v", u, err)
	}
	if _, err := a.Authenticate(req("Bearer nope")); err == nil {
		t.Fatal("an invalid token is anonymous")
	}
}

// A token sent as a WebSocket subprotocol becomes the Authorization header
// and leaves Sec-WebSocket-Protocol; a header the client sent wins.
func TestWebSocketBearer(t *testing.T) {
	const proto = "base64url.bearer.authorization.k8s.io.dG9rLWE" // tok-a
	upgrade := func() *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/api/v1/namespaces/ns/pods/p/exec", nil)
		r.Header.Set("Connection", "Upgrade")
		r.Header.Set("Upgrade", "websocket")
		r.Header.Set("Sec-WebSocket-Protocol", proto+", v5.channel.k8s.io")
		return r
	}
	r := upgrade()
	if err := WebSocketBearer(r); err != nil || r.Header.Get("Authorization") != "Bearer tok-a" || r.Header.Get("Sec-WebSocket-Protocol") != "v5.channel.k8s.io" {
		t.Fatalf("%v %v", err, r.Header)
	}
	r = upgrade()
	r.Header.Set("Authorization", "Bearer mine")
	if err := WebSocketBearer(r); err != nil || r.Header.Get("Authorization") != "Bearer mine" || r.Header.Get("Sec-WebSocket-Protocol") != "v5.channel.k8s.io" {
		t.Fatalf("with Authorization: %v %v", err, r.Header)
	}
}

package frontdoor

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestFanoutRetry: a watch goes to a replica that is up; a refused
// connection or a 503 is retried on the next one, invisibly; the identity
// reaches fanout in headers and the credential does not.
func TestFanoutRetry(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + ln.Addr().String()
	ln.Close() // connection refused from now on
	busy := newFanoutFake(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer busy.Close()
	var got http.Header
	good := newFanoutFake(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		w.Write([]byte("{}\n"))
	}))
	defer good.Close()
	s, _ := testServer(t, strings.Join([]string{dead, busy.URL, good.URL}, ","), nil)
	for i := range 3 { // each replica goes first once
		req := httptest.NewRequest(http.MethodGet, "/api/v1/namespaces/ns1/pods?watch=true", nil)
		req.Header.Set("Authorization", "Bearer "+tokAlice)
		req.Header.Set("X-Remote-User", "admin")
		req.Header.Set("X-Remote-Group", "system:masters")
		req.Header.Set("Impersonate-User", "admin")
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != 200 || rec.Body.String() != "{}\n" {
			t.Fatalf("watch %d: %d %s", i, rec.Code, rec.Body)
		}
		if got.Get("Authorization") != "" || got.Get("Impersonate-User") != "" || got.Get("X-Remote-User") != "alice" ||
			strings.Join(got.Values("X-Remote-Group"), ",") != "system:authenticated" {
			t.Fatalf("identity headers at fanout: %v", got)
		}
	}
	// With every replica failing, the client gets a 503 Status.
	s2, _ := testServer(t, dead, nil)
	code, body, h := do(s2, tokAlice, "/api/v1/namespaces/ns1/pods?watch=true")
	if c, reason, _ := statusOf(t, body); code != 503 || c != 503 || reason != "ServiceUnavailable" || h.Get("Retry-After") != "1" {
		t.Fatalf("no replica: %d %s", code, body)
	}
}

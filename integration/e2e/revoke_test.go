package e2e

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"herald.dev/integration/stack"
)

// TestTokenRevocation: through the real stack, removing a user's line from
// the token file refuses the user on reload. A file that fails to parse,
// or is deleted, refuses every token (fail closed: the last good tokens
// are not kept) and is loud: one log line per change (not per check), the
// error counter, herald_frontdoor_trust_source_broken 1 and
// herald_frontdoor_config_last_reload_successful 0, and /readyz failing
// with the source named; all of which recovers once a file that loads is
// back. Emptying the file (valid) refuses everyone and is not an error.
func TestTokenRevocation(t *testing.T) {
	e := startStack(t, stack.Options{Flags: map[string][]string{"frontdoor": {"--reload-interval=200ms"}}})
	front := e.Proc("frontdoor-0")
	path := filepath.Join(filepath.Dir(e.Kubeconfig), "tokens.csv")
	b, err := os.ReadFile(path)
	must(t, err)
	adminLine := string(b)
	addTokens(t, e, "mallory-token,mallory,u-mallory,\"system:masters\"")
	admin, mallory := e.client(e.Token, nil), e.client("mallory-token", nil)

	// replace swaps the file as Kubernetes updates a mounted Secret: never
	// half written.
	replace := func(content string) {
		t.Helper()
		tmp := path + ".new"
		must(t, os.WriteFile(tmp, []byte(content), 0o600))
		must(t, os.Rename(tmp, path))
	}
	code := func(c *http.Client) int {
		t.Helper()
		resp, err := c.Get(e.FrontdoorURL + "/api/v1/pods")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	eventually := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not after 15s (reload-interval 200ms)", what)
			}
			time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
		}
	}
	readyz := func() (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + front.Admin + "/readyz")
		must(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(body)
	}
	// loud checks the signs of a broken (or loaded) token file.
	loud := func(when string, broken bool, errors float64) {
		t.Helper()
		wantOK, wantBroken, wantCode := 1.0, 0.0, http.StatusOK
		if broken {
			wantOK, wantBroken, wantCode = 0, 1, http.StatusServiceUnavailable
		}
		ok := metricLabeled(t, front, "herald_frontdoor_config_last_reload_successful", `what="token file"`)
		br := metricLabeled(t, front, "herald_frontdoor_trust_source_broken", `what="token file"`)
		n := metricLabeled(t, front, "herald_frontdoor_config_reloads_total", `what="token file",result="error"`)
		if ok != wantOK || br != wantBroken || n != errors {
			t.Errorf("%s: last_reload_successful %v, trust_source_broken %v, %v errors counted; want %v, %v, %v", when, ok, br, n, wantOK, wantBroken, errors)
		}
		c, body := readyz()
		named := strings.Contains(body, "[-]trust-files failed: token file: ")
		if c != wantCode || named != broken {
			t.Errorf("%s: /readyz %d, want %d (token file named: %v)\n%s", when, c, wantCode, broken, body)
		}
	}

	replace(adminLine)
	eventually("mallory refused once her line is removed", func() bool { return code(mallory) == http.StatusUnauthorized })
	if c := code(admin); c != http.StatusOK {
		t.Fatalf("admin after mallory's removal: %d", c)
	}
	loud("loaded", false, 0)

	replace(adminLine + "\"unterminated,nobody\n")
	eventually("every token refused while the file does not parse", func() bool { return code(admin) == http.StatusUnauthorized })
	loud("the file does not parse", true, 1)

	replace(adminLine)
	eventually("the admin token back once the file is fixed", func() bool { return code(admin) == http.StatusOK })
	loud("fixed", false, 1)

	must(t, os.Remove(path))
	eventually("every token refused once the file is deleted", func() bool { return code(admin) == http.StatusUnauthorized })
	loud("deleted", true, 2)

	replace("")
	eventually("the empty file loaded", func() bool {
		return metricLabeled(t, front, "herald_frontdoor_trust_source_broken", `what="token file"`) == 0
	})
	if c := code(admin); c != http.StatusUnauthorized {
		t.Errorf("admin once the file is emptied: %d, want 401", c)
	}
	loud("emptied", false, 2)

	// One line per broken change, though each was checked many times
	// (every 200ms) before the next change was noticed.
	logs, _ := os.ReadFile(e.logs)
	if n := strings.Count(string(logs), `reload failed; its trust is removed until it loads" component=frontdoor what="token file"`); n != 2 {
		t.Errorf("%d log lines for the two broken changes of the token file, want 2", n)
	}
}

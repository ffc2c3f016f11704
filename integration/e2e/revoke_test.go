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
// the token file refuses the user on reload; a file that fails to parse
// keeps the last good tokens and is loud (one log line, the error counter,
// herald_frontdoor_config_last_reload_successful 0, a warning on /readyz
// that stays 200); emptying the file refuses everyone.
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
	reloadOK := func() float64 {
		return metricLabeled(t, front, "herald_frontdoor_config_last_reload_successful", `what="token file"`)
	}

	replace(adminLine)
	eventually("mallory refused once her line is removed", func() bool { return code(mallory) == http.StatusUnauthorized })
	if c := code(admin); c != http.StatusOK {
		t.Fatalf("admin after mallory's removal: %d", c)
	}

	replace(adminLine + "\"unterminated,nobody\n")
	eventually("the broken file reported", func() bool { return reloadOK() == 0 })
	if c := code(admin); c != http.StatusOK {
		t.Fatalf("admin while the file does not parse: %d, want the last good tokens", c)
	}
	if n := metricLabeled(t, front, "herald_frontdoor_config_reloads_total", `what="token file",result="error"`); n != 1 {
		t.Errorf("reload errors counted: %v, want 1", n)
	}
	resp, err := http.Get("http://" + front.Admin + "/readyz")
	must(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "[!]config-files warning: token file: serving the last good one") {
		t.Errorf("/readyz while the token file does not parse: %d\n%s", resp.StatusCode, body)
	}
	logs, _ := os.ReadFile(e.logs)
	if n := strings.Count(string(logs), `reload failed; keeping the previous configuration" component=frontdoor what="token file"`); n != 1 {
		t.Errorf("%d log lines for the broken token file, want 1", n)
	}

	replace("")
	eventually("everyone refused once the file is emptied", func() bool { return code(admin) == http.StatusUnauthorized })
	if v := reloadOK(); v != 1 {
		t.Errorf("last_reload_successful after the empty file loaded: %v", v)
	}
}

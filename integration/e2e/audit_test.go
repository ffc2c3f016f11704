package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"herald.dev/integration/stack"
)

// TestAuditLog: frontdoor writes one kube-apiserver audit Event
// (audit.k8s.io/v1) per request to --audit-log-path, read here with
// kube-apiserver's own types: who (user), what (verb, objectRef), from
// where (sourceIPs, userAgent), the authorization decision and the code,
// under the audit ID the client got. Reads served from the cache appear
// nowhere else. Cases: a cached LIST, a watch (ResponseStarted then
// ResponseComplete, as kube-apiserver logs long-running requests), a 403
// and a 401 (one event at ResponseStarted naming the credential tried, as
// kube-apiserver logs failed authentications).
func TestAuditLog(t *testing.T) {
	auditPath := filepath.Join(t.TempDir(), "audit.log")
	e := startStack(t, stack.Options{Flags: map[string][]string{"frontdoor": {"--audit-log-path=" + auditPath}}})
	ctx := testContext(t, time.Minute)
	_, want := e.watchSeesPut(t, ctx, "audit")

	// bob: authenticated, allowed nothing.
	f, err := os.OpenFile(e.TokenFile, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("bob-audit-token,bob,bob-uid,\"team-b\"\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()

	send := func(token, ua, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.FrontdoorURL+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("User-Agent", ua)
		resp, err := e.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Audit-Id")
	}
	ids := map[string]string{} // user agent -> audit ID
	code, id := send(e.Token, "audit-test/list", "/api/v1/namespaces/audit/pods")
	if code != 200 {
		t.Fatalf("LIST: %d", code)
	}
	ids["audit-test/list"] = id
	// A watch that ends by itself (timeoutSeconds), read to its end.
	code, id = send(e.Token, "audit-test/watch", "/api/v1/namespaces/audit/pods?watch=true&timeoutSeconds=1&resourceVersion="+jsonInt(want.RV))
	if code != 200 {
		t.Fatalf("WATCH: %d", code)
	}
	ids["audit-test/watch"] = id
	// The token file is reloaded within --reload-interval: until then bob
	// is unknown (401, under another user agent).
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, id = send("bob-audit-token", "audit-test/forbidden", "/api/v1/namespaces/audit/secrets/s1")
		if code == http.StatusForbidden || time.Now().After(deadline) {
			break
		}
		if code != http.StatusUnauthorized {
			t.Fatalf("bob: %d", code)
		}
		time.Sleep(100 * time.Millisecond) // polling the reload, not synchronizing
	}
	if code != http.StatusForbidden {
		t.Fatalf("bob after the token file's reload: %d", code)
	}
	ids["audit-test/forbidden"] = id
	code, id = send("no-such-token", "audit-test/unauthorized", "/api/v1/pods")
	if code != http.StatusUnauthorized {
		t.Fatalf("a bad token: %d", code)
	}
	ids["audit-test/unauthorized"] = id

	// The writer flushes once its queue is empty: read until every
	// request's events are there.
	var events map[string][]auditv1.Event
	for deadline := time.Now().Add(20 * time.Second); ; {
		events = readAudit(t, auditPath)
		if len(events[ids["audit-test/list"]]) == 1 && len(events[ids["audit-test/watch"]]) == 2 &&
			len(events[ids["audit-test/forbidden"]]) == 1 && len(events[ids["audit-test/unauthorized"]]) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit events by ID after 20 s: %+v (want IDs %v)", events, ids)
		}
		time.Sleep(50 * time.Millisecond)
	}

	check := func(ev auditv1.Event, ua string, stage auditv1.Stage, verb, user string, ref *auditv1.ObjectReference, decision string, code int32) {
		t.Helper()
		if ev.Kind != "Event" || ev.APIVersion != "audit.k8s.io/v1" || ev.Level != auditv1.LevelMetadata {
			t.Errorf("%s: %s %s level %s", ua, ev.APIVersion, ev.Kind, ev.Level)
		}
		if ev.UserAgent != ua || ev.Stage != stage || ev.Verb != verb || ev.User.Username != user {
			t.Errorf("%s: user agent %q stage %s verb %q user %q, want %s %s %q", ua, ev.UserAgent, ev.Stage, ev.Verb, ev.User.Username, stage, verb, user)
		}
		if !slices.Equal(ev.SourceIPs, []string{"127.0.0.1"}) {
			t.Errorf("%s: source IPs %v", ua, ev.SourceIPs)
		}
		if (ev.ObjectRef == nil) != (ref == nil) || ref != nil && *ev.ObjectRef != *ref {
			t.Errorf("%s: objectRef %+v, want %+v", ua, ev.ObjectRef, ref)
		}
		if got := ev.Annotations["authorization.k8s.io/decision"]; got != decision {
			t.Errorf("%s: decision %q, want %q", ua, got, decision)
		}
		if ev.ResponseStatus == nil || ev.ResponseStatus.Code != code {
			t.Errorf("%s: response status %+v, want code %d", ua, ev.ResponseStatus, code)
		}
		if ev.RequestReceivedTimestamp.IsZero() || ev.StageTimestamp.Before(&ev.RequestReceivedTimestamp) {
			t.Errorf("%s: received %v, stage %v", ua, ev.RequestReceivedTimestamp, ev.StageTimestamp)
		}
		if !strings.HasPrefix(ev.RequestURI, "/api/v1/") {
			t.Errorf("%s: requestURI %q", ua, ev.RequestURI)
		}
	}
	pods := &auditv1.ObjectReference{Resource: "pods", Namespace: "audit", APIVersion: "v1"}
	admin := "herald-admin"
	check(events[ids["audit-test/list"]][0], "audit-test/list", auditv1.StageResponseComplete, "list", admin, pods, "allow", 200)
	w := events[ids["audit-test/watch"]]
	check(w[0], "audit-test/watch", auditv1.StageResponseStarted, "watch", admin, pods, "allow", 200)
	check(w[1], "audit-test/watch", auditv1.StageResponseComplete, "watch", admin, pods, "allow", 200)
	if !strings.Contains(w[0].RequestURI, "watch=true") {
		t.Errorf("watch requestURI %q", w[0].RequestURI)
	}
	forbidden := events[ids["audit-test/forbidden"]][0]
	check(forbidden, "audit-test/forbidden", auditv1.StageResponseComplete, "get", "bob",
		&auditv1.ObjectReference{Resource: "secrets", Namespace: "audit", Name: "s1", APIVersion: "v1"}, "forbid", 403)
	// The reason is the authorizer's, as kube-apiserver annotates it
	// (RBAC gives none for a request no rule allows).
	if _, reason := forbidden.Annotations["authorization.k8s.io/reason"]; forbidden.User.UID != "bob-uid" || !slices.Contains(forbidden.User.Groups, "team-b") || !reason {
		t.Errorf("403: user %+v, annotations %v", forbidden.User, forbidden.Annotations)
	}
	unauthorized := events[ids["audit-test/unauthorized"]][0]
	check(unauthorized, "audit-test/unauthorized", auditv1.StageResponseStarted, "list", "", &auditv1.ObjectReference{Resource: "pods", APIVersion: "v1"}, "", 401)
	if unauthorized.ResponseStatus != nil && unauthorized.ResponseStatus.Message != "Authentication failed, attempted: bearer" {
		t.Errorf("401: message %q", unauthorized.ResponseStatus.Message)
	}
}

// readAudit decodes every line of the audit log, by audit ID.
func readAudit(t *testing.T, path string) map[string][]auditv1.Event {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	out := map[string][]auditv1.Event{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var ev auditv1.Event
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ev); err != nil {
			t.Fatalf("audit line %q: %v", sc.Text(), err)
		}
		out[string(ev.AuditID)] = append(out[string(ev.AuditID)], ev)
	}
	return out
}

func jsonInt(n int64) string { b, _ := json.Marshal(n); return string(b) }

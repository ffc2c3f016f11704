package loadgen

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
)

// The manifest frontdoor loads is a v1 List of the ClusterRole and the
// ClusterRoleBinding that grant the fleet's group get, list and watch on
// pods, and nothing else.
func TestFleetPolicy(t *testing.T) {
	dir, err := WriteFleetPolicy(filepath.Join(t.TempDir(), "rbac"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "fleet-rbac.json"))
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		APIVersion, Kind string
		Items            []json.RawMessage
	}
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	if list.APIVersion != "v1" || list.Kind != "List" || len(list.Items) != 2 {
		t.Fatalf("want a v1 List of 2 items, got %s %s of %d:\n%s", list.APIVersion, list.Kind, len(list.Items), b)
	}
	var role rbacv1.ClusterRole
	var binding rbacv1.ClusterRoleBinding
	if err := json.Unmarshal(list.Items[0], &role); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(list.Items[1], &binding); err != nil {
		t.Fatal(err)
	}
	if role.APIVersion != "rbac.authorization.k8s.io/v1" || role.Kind != "ClusterRole" || role.Name != FleetRole {
		t.Errorf("role: %s %s %s", role.APIVersion, role.Kind, role.Name)
	}
	want := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}
	if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].APIGroups, want.APIGroups) || !slices.Equal(role.Rules[0].Resources, want.Resources) ||
		!slices.Equal(role.Rules[0].Verbs, want.Verbs) || len(role.Rules[0].ResourceNames) != 0 {
		t.Errorf("rules %+v, want [%+v]", role.Rules, want)
	}
	if binding.Kind != "ClusterRoleBinding" || binding.RoleRef != (rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: FleetRole}) {
		t.Errorf("binding %s, roleRef %+v", binding.Kind, binding.RoleRef)
	}
	if len(binding.Subjects) != 1 || binding.Subjects[0] != (rbacv1.Subject{APIGroup: "rbac.authorization.k8s.io", Kind: "Group", Name: FleetGroup}) {
		t.Errorf("subjects %+v, want the group %s", binding.Subjects, FleetGroup)
	}
}

// fakeRBAC is a kube-apiserver that authorizes the fleet's token once both
// objects exist and its informer has caught up: lag LISTs later.
type fakeRBAC struct {
	mu      sync.Mutex
	created []string // "path by token"
	lag     int
}

func (f *fakeRBAC) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	token := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	switch {
	case r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/apis/rbac.authorization.k8s.io/v1/"):
		var obj struct{ Kind string }
		if err := json.NewDecoder(r.Body).Decode(&obj); err != nil || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		f.created = append(f.created, obj.Kind+" at "+strings.TrimPrefix(r.URL.Path, "/apis/rbac.authorization.k8s.io/v1/")+" by "+token)
		w.WriteHeader(http.StatusCreated)
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/pods" && token == "fleet":
		if len(f.created) < 2 || f.lag > 0 {
			f.lag--
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		w.Write([]byte(`{"kind":"PodList","metadata":{"resourceVersion":"7"},"items":[]}`))
	default:
		http.Error(w, "unexpected", http.StatusTeapot)
	}
}

// GrantFleet creates the role, then the binding, with the admin token and
// returns once the fleet's token is answered 200 (not merely once the
// objects are created); it fails if that never happens.
func TestGrantFleet(t *testing.T) {
	f := &fakeRBAC{lag: 3}
	srv := httptest.NewServer(f)
	defer srv.Close()
	if err := GrantFleet(context.Background(), srv.Client(), srv.URL, "admin", "fleet", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	want := []string{"ClusterRole at clusterroles by admin", "ClusterRoleBinding at clusterrolebindings by admin"}
	if !slices.Equal(f.created, want) || f.lag != 0 {
		t.Errorf("created %q (lag left %d), want %q and every refusal waited out", f.created, f.lag, want)
	}

	if err := WaitAuthorized(context.Background(), srv.Client(), srv.URL, "someone-else", 300*time.Millisecond); err == nil || !strings.Contains(err.Error(), "418") {
		t.Errorf("a token never authorized: got %v, want the last answer", err)
	}
}

// The report says which server processes ran with GODEBUG's schedtrace,
// and describes the fleet's token, grant and timing where a workload has
// them.
func TestReportFleetAndSysmon(t *testing.T) {
	fleet := Workload{Name: "broadcast-200x100-fleet", Watchers: 200, WritesPerSec: 100, Fleet: true,
		Duration: 15 * time.Second, Warmup: 500 * time.Millisecond, Settle: 5 * time.Second}
	plain := Workload{Name: "broadcast-200x100", Watchers: 200, WritesPerSec: 100, Duration: 20 * time.Second}
	for _, tc := range []struct {
		name      string
		rp        Report
		want, not []string
	}{
		{"default", Report{Workloads: []Workload{plain}},
			[]string{"Every server process of both systems (the etcd and NATS hosts, Herald's services, kube-apiserver) runs with `GODEBUG=schedtrace=2147483647`", "`--authorization-mode=AlwaysAllow`, static tokens"},
			[]string{"-fleet", "RBAC"}},
		{"herald only", Report{Workloads: []Workload{plain}, SysmonAwake: "herald"},
			[]string{"Herald's server processes (the etcd and NATS hosts, its services) run with `GODEBUG=schedtrace=2147483647`", "kube-apiserver and its etcd host run without it (`-godebug herald`)"},
			[]string{"Every server process of both systems"}},
		{"none, with a fleet", Report{Workloads: []Workload{plain, fleet}, SysmonAwake: "none"},
			[]string{"No server process of either system is started with GODEBUG's schedtrace (`-godebug none`)", "Herald's services, started so, re-execute themselves",
				"`--authorization-mode=AlwaysAllow` (workloads named `-fleet`: `--authorization-mode=RBAC`), static tokens",
				"all in group system:masters (but for the `-fleet` workloads, below)",
				"user `herald-bench-watcher` in group `herald:bench-watchers`, not in system:masters",
				"ClusterRole `herald-bench-pod-reader` allowing get, list and watch on pods",
				"### broadcast-200x100-fleet: 200 broadcast (every watcher sees every pod), every watcher the same token, of a user outside system:masters authorized by RBAC, watchers, one HTTP/1.1 connection per watcher, JSON storage and clients, 100 writes/s for 15s (settled 5s before the watchers opened, 500ms of warm-up from the last watcher's opening)",
				"### broadcast-200x100: 200 broadcast (every watcher sees every pod) watchers, one HTTP/1.1 connection per watcher, JSON storage and clients, 100 writes/s for 20s (settled 0s before the watchers opened, 0s of warm-up after)"},
			[]string{"Every server process of both systems"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			tc.rp.Write(&b)
			for _, s := range tc.want {
				if !strings.Contains(b.String(), s) {
					t.Errorf("report lacks %q:\n%s", s, b.String())
				}
			}
			for _, s := range tc.not {
				if strings.Contains(b.String(), s) {
					t.Errorf("report has %q:\n%s", s, b.String())
				}
			}
		})
	}
}

package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The fleet's user (Workload.Fleet): every watcher presents its one token.
// It is not in system:masters, so each system's RBAC authorizer decides its
// requests by FleetRBAC's grant.
const (
	FleetUser  = "herald-bench-watcher"
	FleetGroup = "herald:bench-watchers"
	// FleetRole names the ClusterRole and the ClusterRoleBinding.
	FleetRole = "herald-bench-pod-reader"
)

// FleetRBAC is the fleet's grant: a ClusterRole allowing get, list and
// watch on pods, bound to FleetGroup cluster-wide.
func FleetRBAC() (*rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding) {
	typeMeta := func(kind string) metav1.TypeMeta {
		return metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: kind}
	}
	role := &rbacv1.ClusterRole{TypeMeta: typeMeta("ClusterRole"), ObjectMeta: metav1.ObjectMeta{Name: FleetRole},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}}}
	binding := &rbacv1.ClusterRoleBinding{TypeMeta: typeMeta("ClusterRoleBinding"), ObjectMeta: metav1.ObjectMeta{Name: FleetRole},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: FleetRole},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: FleetGroup}}}
	return role, binding
}

// FleetPolicy is FleetRBAC as one manifest file (a v1 List, JSON), for
// Herald's frontdoor (--authorization.rbac-dir).
func FleetPolicy() []byte {
	role, binding := FleetRBAC()
	list := struct {
		metav1.TypeMeta
		Items []any `json:"items"`
	}{metav1.TypeMeta{APIVersion: "v1", Kind: "List"}, []any{role, binding}}
	b, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		panic(err) // fixed types: cannot fail
	}
	return append(b, '\n')
}

// WriteFleetPolicy writes FleetPolicy as the only manifest of dir (created
// if missing) and returns dir.
func WriteFleetPolicy(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	return dir, os.WriteFile(filepath.Join(dir, "fleet-rbac.json"), FleetPolicy(), 0o644)
}

// GrantFleet creates FleetRBAC's objects through kube-apiserver's API at
// base with adminToken, then waits until fleetToken is authorized
// (WaitAuthorized): the RBAC authorizer reads the objects from its informer,
// some time after they are created.
func GrantFleet(ctx context.Context, c *http.Client, base, adminToken, fleetToken string, timeout time.Duration) error {
	role, binding := FleetRBAC()
	for _, o := range []struct {
		path string
		obj  any
	}{{"clusterroles", role}, {"clusterrolebindings", binding}} {
		body, _ := json.Marshal(o.obj)
		if err := post(ctx, c, base+"/apis/rbac.authorization.k8s.io/v1/"+o.path, adminToken, body); err != nil {
			return err
		}
	}
	return WaitAuthorized(ctx, c, base, fleetToken, timeout)
}

// WaitAuthorized waits until a LIST of pods at base with token answers
// 200, and fails with the last answer after timeout.
func WaitAuthorized(ctx context.Context, c *http.Client, base, token string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		_, err := Get(ctx, c, base+"/api/v1/pods?limit=1", token)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("a LIST of pods with the token not answered 200 after %s: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// post POSTs a JSON object and expects 201 Created.
func post(ctx context.Context, c *http.Client, url, token string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("POST %s: %s: %s", url, resp.Status, b)
	}
	return nil
}

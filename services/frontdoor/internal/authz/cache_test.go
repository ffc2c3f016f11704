package authz

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"

	"herald.dev/services/frontdoor/internal/upstream"
)

// heapAfterGC is the live heap once garbage is collected.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// newDenyingKube is a stand-in kube-apiserver that denies every
// SubjectAccessReview and keeps none.
func newDenyingKube(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var sar authorizationv1.SubjectAccessReview
		if err := json.NewDecoder(r.Body).Decode(&sar); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		sar.APIVersion, sar.Kind = "authorization.k8s.io/v1", "SubjectAccessReview"
		sar.Status = authorizationv1.SubjectAccessReviewStatus{Allowed: false, Reason: "no"}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(&sar)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestReviewCacheBytes: the SubjectAccessReview authorizer's cache holds at
// most its byte budget, however many different reviews (here 2,000 denied
// ones, each with an 8 KiB selector, within max-selector-bytes) are asked.
func TestReviewCacheBytes(t *testing.T) {
	k := newDenyingKube(t)
	cfg := &rest.Config{Host: k.URL, QPS: -1}
	client, err := authorizationclient.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const budget = 128 << 10
	az := NewReviewAuthorizer(client, upstream.Config{AuthzAllowCacheTTL: time.Minute, AuthzDenyCacheTTL: time.Minute,
		AuthzCacheBytes: budget, AuthzCacheBytesPerUser: budget}, wait.Backoff{Duration: 200 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 3})
	u := &user.DefaultInfo{Name: "dan", Groups: []string{"system:authenticated"}}
	before := heapAfterGC()
	const n = 2000
	for i := range n {
		sel := fields.OneTermEqualSelector("metadata.name", fmt.Sprintf("%d-%s", i, strings.Repeat("x", 8<<10)))
		d, _, err := az.Authorize(context.Background(), &authorizer.AttributesRecord{User: u, Verb: "list", ResourceRequest: true,
			APIVersion: "v1", Resource: "secrets", Namespace: "demo", FieldSelectorRequirements: sel.Requirements()})
		if err != nil || d == authorizer.DecisionAllow {
			t.Fatalf("review %d: %v %v", i, d, err)
		}
	}
	grown := int64(heapAfterGC()) - int64(before)
	bytes, entries := az.cache.size()
	t.Logf("%d denied reviews with 8 KiB selectors: heap %+d KiB after GC; cache %d bytes in %d entries", n, grown>>10, bytes, entries)
	// The budget, and at most 1 MiB the client and the runtime keep.
	if grown > budget+1<<20 {
		t.Errorf("%d denied reviews with 8 KiB selectors kept %d KiB", n, grown>>10)
	}
	if bytes > budget || entries == 0 || entries >= n {
		t.Errorf("cache holds %d bytes in %d entries, want within %d bytes and some evicted", bytes, entries, budget)
	}
	runtime.KeepAlive(az)
}

// TestReviewCacheShares: one user's many reviews evict its own entries,
// not another's; entries expire after their TTL; the budget holds.
func TestReviewCacheShares(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newReviewCache(100*(entryOverhead+8), 10*(entryOverhead+8))
	c.now = func() time.Time { return now }
	key := func(s string) [32]byte { return reviewKey(&authorizer.AttributesRecord{Verb: "get", Path: s}) }
	c.add(key("carol-1"), "carol", authorizer.DecisionAllow, "", time.Minute)
	c.add(key("carol-2"), "carol", authorizer.DecisionDeny, "no", 10*time.Second)
	for i := range 1000 {
		c.add(key(fmt.Sprint("mallory-", i)), "mallory", authorizer.DecisionDeny, "", time.Minute)
	}
	if d, _, ok := c.get(key("carol-1")); !ok || d != authorizer.DecisionAllow {
		t.Errorf("carol's allowed review evicted by mallory's flood: %v %v", d, ok)
	}
	if d, reason, ok := c.get(key("carol-2")); !ok || d != authorizer.DecisionDeny || reason != "no" {
		t.Errorf("carol's denied review: %v %q %v", d, reason, ok)
	}
	if _, _, ok := c.get(key("mallory-0")); ok {
		t.Error("mallory's oldest review kept past its share")
	}
	if _, _, ok := c.get(key("mallory-999")); !ok {
		t.Error("mallory's latest review not cached")
	}
	bytes, entries := c.size()
	if bytes > c.max || c.users["mallory"].bytes > c.perUser || entries != 12 {
		t.Errorf("%d bytes in %d entries, mallory %d bytes; want at most %d and %d, 12 entries", bytes, entries, c.users["mallory"].bytes, c.max, c.perUser)
	}
	now = now.Add(11 * time.Second)
	if _, _, ok := c.get(key("carol-2")); ok {
		t.Error("denied review served past its TTL")
	}
	if _, _, ok := c.get(key("carol-1")); !ok {
		t.Error("allowed review expired before its TTL")
	}
	// Different users, verbs, selectors: different keys.
	u := func(name string) user.Info { return &user.DefaultInfo{Name: name} }
	base := authorizer.AttributesRecord{User: u("a"), Verb: "list", ResourceRequest: true, Resource: "secrets", Namespace: "ns"}
	keys := map[[32]byte]string{}
	for name, a := range map[string]authorizer.AttributesRecord{
		"base": base,
		"user": func() authorizer.AttributesRecord { b := base; b.User = u("b"); return b }(),
		"verb": func() authorizer.AttributesRecord { b := base; b.Verb = "watch"; return b }(),
		"name": func() authorizer.AttributesRecord { b := base; b.Name = "x"; return b }(),
		"ns":   func() authorizer.AttributesRecord { b := base; b.Namespace = "ns2"; return b }(),
		"field": func() authorizer.AttributesRecord {
			b := base
			b.FieldSelectorRequirements = fields.OneTermEqualSelector("a", "b").Requirements()
			return b
		}(),
		"shift": func() authorizer.AttributesRecord { b := base; b.Namespace, b.Resource = "nss", "ecrets"; return b }(),
	} {
		k := reviewKey(&a)
		if other, dup := keys[k]; dup {
			t.Errorf("%s and %s share a key", name, other)
		}
		keys[k] = name
	}
}

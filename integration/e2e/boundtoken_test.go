package e2e

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"herald.dev/integration/stack"
)

// TestStandaloneBoundTokens: a standalone frontdoor (service-account keys,
// no cluster to review tokens) checks a bound service-account token's
// binding against the cache, as kube-apiserver's token validator does: the
// Pod, Node or Secret the claims name must be in the cache with the claimed
// uid. A token whose pod is deleted, or deleted and created again (another
// uid), is refused with 401; so are a node-bound token whose node is gone
// and a secret-bound token whose secret is.
func TestStandaloneBoundTokens(t *testing.T) {
	fx := newSecurityFixture(t, securityRBAC)
	e := startStack(t, stack.Options{Flags: map[string][]string{"frontdoor": fx.flags}})
	ctx := testContext(t, 80*time.Second)
	admin := e.client(e.Token, nil)
	put := func(key string, obj map[string]any) {
		t.Helper()
		b, _ := json.Marshal(obj)
		if _, err := e.etcd.Put(ctx, key, string(b)); err != nil {
			t.Fatal(err)
		}
	}
	del := func(key string) {
		t.Helper()
		if _, err := e.etcd.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	meta := func(ns, name, uid string) map[string]any {
		m := map[string]any{"name": name, "uid": uid}
		if ns != "" {
			m["namespace"] = ns
		}
		return m
	}
	pod := func(uid string) map[string]any {
		return map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": meta("team-a", "web", uid),
			"spec": map[string]any{"nodeName": "n1", "serviceAccountName": "builder", "containers": []map[string]any{{"name": "c", "image": "img"}}}}
	}
	put("/registry/pods/team-a/web", pod("uid-web-1"))
	put("/registry/minions/n1", map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": meta("", "n1", "uid-n1")})
	put("/registry/secrets/team-a/tok", map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": meta("team-a", "tok", "uid-tok"), "type": "Opaque"})

	// eventually polls cond (a condition with a deadline: the cache applies
	// etcd's changes asynchronously).
	eventually := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 20s", what)
			}
			time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
		}
	}
	uidOf := func(path string) string {
		resp, err := admin.Get(e.FrontdoorURL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var o struct {
			Metadata struct {
				UID string `json:"uid"`
			} `json:"metadata"`
		}
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&o) != nil {
			return ""
		}
		return o.Metadata.UID
	}
	eventually("the cache holds the pod, the node and the secret", func() bool {
		return uidOf("/api/v1/namespaces/team-a/pods/web") == "uid-web-1" && uidOf("/api/v1/nodes/n1") == "uid-n1" &&
			uidOf("/api/v1/namespaces/team-a/secrets/tok") == "uid-tok"
	})

	exp := time.Now().Add(time.Hour)
	ref := func(name, uid string) map[string]string { return map[string]string{"name": name, "uid": uid} }
	podToken := func(uid string) string {
		return boundJWT(t, fx.saKey, "team-a", "builder", exp, map[string]any{"pod": ref("web", uid), "node": ref("n1", "uid-n1")})
	}
	const pods = "/api/v1/namespaces/team-a/pods"
	code := func(token string) int {
		t.Helper()
		c, _ := request(t, e.client(token, nil), e.FrontdoorURL+pods)
		return c
	}
	web1 := podToken("uid-web-1")
	for _, tc := range []struct {
		name  string
		token string
		code  int
	}{
		{"bound to the live pod", web1, http.StatusOK},
		{"bound to an earlier pod of the name", podToken("uid-web-0"), http.StatusUnauthorized},
		{"bound to a pod that does not exist", boundJWT(t, fx.saKey, "team-a", "builder", exp, map[string]any{"pod": ref("gone", "uid-gone")}), http.StatusUnauthorized},
		{"bound to the live node", boundJWT(t, fx.saKey, "team-a", "builder", exp, map[string]any{"node": ref("n1", "uid-n1")}), http.StatusOK},
		{"bound to an earlier node of the name", boundJWT(t, fx.saKey, "team-a", "builder", exp, map[string]any{"node": ref("n1", "uid-n0")}), http.StatusUnauthorized},
		{"bound to the live secret", boundJWT(t, fx.saKey, "team-a", "builder", exp, map[string]any{"secret": ref("tok", "uid-tok")}), http.StatusOK},
		{"bound to an earlier secret of the name", boundJWT(t, fx.saKey, "team-a", "builder", exp, map[string]any{"secret": ref("tok", "uid-tok0")}), http.StatusUnauthorized},
		{"not bound", boundJWT(t, fx.saKey, "team-a", "builder", exp, nil), http.StatusOK},
	} {
		if got := code(tc.token); got != tc.code {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.code)
		}
	}

	// The pod is deleted: its token stops working once the cache has the
	// deletion (the node it ran on is still there).
	del("/registry/pods/team-a/web")
	eventually("the token of the deleted pod refused", func() bool { return code(web1) == http.StatusUnauthorized })
	// Created again under the same name: another pod, another uid. The old
	// token stays refused; the new pod's token works.
	put("/registry/pods/team-a/web", pod("uid-web-2"))
	eventually("the cache holds the new pod", func() bool { return uidOf("/api/v1/namespaces/team-a/pods/web") == "uid-web-2" })
	if got := code(web1); got != http.StatusUnauthorized {
		t.Errorf("token of the first pod once the name is reused: %d, want 401", got)
	}
	if got := code(podToken("uid-web-2")); got != http.StatusOK {
		t.Errorf("token of the new pod: %d, want 200", got)
	}

	secretTok := boundJWT(t, fx.saKey, "team-a", "builder", exp, map[string]any{"secret": ref("tok", "uid-tok")})
	del("/registry/secrets/team-a/tok")
	eventually("the token of the deleted secret refused", func() bool { return code(secretTok) == http.StatusUnauthorized })
	nodeTok := boundJWT(t, fx.saKey, "team-a", "builder", exp, map[string]any{"node": ref("n1", "uid-n1")})
	del("/registry/minions/n1")
	eventually("the token of the deleted node refused", func() bool { return code(nodeTok) == http.StatusUnauthorized })
}

// boundJWT signs (ES256, by hand: the test does not share the verifier's
// JWT library) a service-account token as TokenRequest issues one, its
// "kubernetes.io" claim carrying the bound objects (pod, node, secret).
func boundJWT(t testing.TB, key *ecdsa.PrivateKey, ns, name string, exp time.Time, bound map[string]any) string {
	t.Helper()
	k8s := map[string]any{"namespace": ns, "serviceaccount": map[string]string{"name": name, "uid": "uid-" + name}}
	for k, v := range bound {
		k8s[k] = v
	}
	enc := base64.RawURLEncoding
	hdr, _ := json.Marshal(map[string]string{"alg": "ES256", "typ": "JWT", "kid": "test"})
	claims, _ := json.Marshal(map[string]any{
		"iss": saIssuer, "aud": []string{saIssuer}, "sub": "system:serviceaccount:" + ns + ":" + name,
		"iat": exp.Add(-time.Hour).Unix(), "nbf": exp.Add(-time.Hour).Unix(), "exp": exp.Unix(),
		"jti": "jti-" + name, "kubernetes.io": k8s,
	})
	input := enc.EncodeToString(hdr) + "." + enc.EncodeToString(claims)
	sum := sha256.Sum256([]byte(input))
	r, s, err := ecdsa.Sign(rand.Reader, key, sum[:])
	must(t, err)
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return input + "." + enc.EncodeToString(sig)
}

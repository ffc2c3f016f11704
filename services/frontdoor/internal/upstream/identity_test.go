package upstream

import (
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apiserver/pkg/authentication/user"
)

// setImpersonation names exactly the user, drops whatever identity or
// credential the client sent, and escapes extra keys so that
// kube-apiserver reads them back (lower-cased, path-unescaped).
func TestSetImpersonation(t *testing.T) {
	h := http.Header{}
	h.Set("Authorization", "Bearer secret")
	h.Set("Cookie", "c=1")
	h.Set("Impersonate-User", "system:admin")
	h.Set("X-Remote-Group", "system:masters")
	extra := map[string][]string{"example.com/key:a@b=c%d": {"v1", "v2"}}
	setImpersonation(h, &user.DefaultInfo{Name: "alice", UID: "u-1", Groups: []string{"g1", "g2"}, Extra: extra})
	if h.Get("Authorization") != "" || h.Get("Cookie") != "" || h.Get("X-Remote-Group") != "" {
		t.Fatalf("client identity kept: %v", h)
	}
	if h.Get("Impersonate-User") != "alice" || h.Get("Impersonate-Uid") != "u-1" || !reflect.DeepEqual(h.Values("Impersonate-Group"), []string{"g1", "g2"}) {
		t.Fatalf("impersonation %v", h)
	}
	for k, vs := range h {
		name, ok := strings.CutPrefix(k, "Impersonate-Extra-")
		if !ok {
			continue
		}
		key, err := url.PathUnescape(strings.ToLower(name))
		if err != nil || key != "example.com/key:a@b=c%d" || !reflect.DeepEqual(vs, []string{"v1", "v2"}) {
			t.Fatalf("extra header %s %v reads back as %q (%v)", k, vs, key, err)
		}
		return
	}
	t.Fatalf("no extra header: %v", h)
}

func TestForwardable(t *testing.T) {
	if !forwardable(&user.DefaultInfo{Name: "a\tb", Groups: []string{"g"}, Extra: map[string][]string{"k": {"v"}}}) {
		t.Error("a tab is refused")
	}
	for _, u := range []*user.DefaultInfo{
		{Name: "a\r\nb"}, {Name: "a", UID: "\x7f"}, {Name: "a", Groups: []string{"g\n"}}, {Name: "a", Extra: map[string][]string{"k": {"\x00"}}},
	} {
		if forwardable(u) {
			t.Errorf("%+v is forwardable", u)
		}
	}
}

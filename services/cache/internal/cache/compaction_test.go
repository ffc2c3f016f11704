package cache

import (
	"fmt"
	"net/http"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/stream"
)

// compactAsKubeAPIServer compacts etcd at rev as kube-apiserver's
// compactor does (k8s.io/apiserver's etcd3 Compact): it records rev in
// compact_rev_key, then compacts. The key is outside the registry: the
// stream gets the progress marker ingest would send for its revision.
func (h *history) compactAsKubeAPIServer(t *testing.T, rev int64) {
	t.Helper()
	resp, err := h.etcd.Put(t.Context(), "compact_rev_key", fmt.Sprint(rev))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.etcd.Compact(t.Context(), rev); err != nil {
		t.Fatal(err)
	}
	data, err := stream.Encode(stream.Progress(resp.Header.Revision))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.js.Publish(t.Context(), stream.SubjectProgress, data); err != nil {
		t.Fatal(err)
	}
}

// TestListExpiredByCompaction: once etcd has compacted the revision of a
// paged list's first page, its continue token is answered as
// kube-apiserver answers it, although the window still holds the
// revision: 410 Expired with a token that continues after the same key at
// the latest state, whose pages then include what changed meanwhile and
// keep the new revision. A list at the compacted revision exactly gets
// 410 too; a token at a revision etcd still holds is served. (The
// conformance test "should support continue listing from the last key if
// the original version has been compacted away".)
func TestListExpiredByCompaction(t *testing.T) {
	h := startHistory(t)
	for i := range 30 {
		h.put(t, "ns", fmt.Sprintf("p%02d", i), 1)
	}
	_, v, _ := startShard(t, h, 0)
	list := func(req *heraldv1.ListRequest) (*heraldv1.ListResponse, error) {
		req.Resource, req.Namespace = "pods", "ns"
		return v.List(t.Context(), req)
	}
	first, err := list(&heraldv1.ListRequest{Limit: 10})
	if err != nil || len(first.Items) != 10 || first.Continue == "" {
		t.Fatalf("first page: %v %v", keysOf(first), err)
	}
	// Changes after the first page: one before the page's end, one after.
	h.put(t, "ns", "p05", 2)
	h.put(t, "ns", "p15a", 1)
	last := h.revs[len(h.revs)-1]
	// Still in etcd: served at the first page's revision.
	if resp, err := list(&heraldv1.ListRequest{Limit: 10, Continue: first.Continue}); err != nil || resp.Revision != first.Revision {
		t.Fatalf("second page before the compaction: %v at %d, %v", keysOf(resp), resp.GetRevision(), err)
	}

	h.compactAsKubeAPIServer(t, last)
	var expired error
	eventually(t, "the first page's token expired", func() string {
		_, expired = list(&heraldv1.ListRequest{Limit: 10, Continue: first.Continue})
		if expired == nil {
			return fmt.Sprintf("the token of revision %d is still served after etcd compacted %d", first.Revision, last)
		}
		return ""
	})
	st := kube.StatusOf(kube.FromGRPC(expired))
	const inconsistent = "The provided continue parameter is too old to display a consistent list result. You can start a new list without " +
		"the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with " +
		"the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the " +
		"first chunk was returned and now may show up in the list."
	if status.Code(expired) != codes.OutOfRange || st.Code != http.StatusGone || st.Reason != "Expired" || st.Message != inconsistent || st.ListMeta.Continue == "" {
		t.Fatalf("expired token: %v, Status %+v", expired, st)
	}

	// The inconsistent token goes on after p09 at the latest revision.
	var names []string
	for _, k := range first.Keys {
		names = append(names, k[len("/registry/pods/ns/"):])
	}
	tok := st.ListMeta.Continue
	for page := 0; tok != ""; page++ {
		resp, err := list(&heraldv1.ListRequest{Limit: 10, Continue: tok})
		if err != nil {
			t.Fatalf("page %d of the inconsistent list: %v", page, err)
		}
		if resp.Revision < last || len(resp.Items) > 10 {
			t.Fatalf("page %d: %d items at %d, want at most 10 at %d or later", page, len(resp.Items), resp.Revision, last)
		}
		if resp.Continue != "" && (resp.RemainingItemCount == nil || int(*resp.RemainingItemCount)+len(resp.Items)+len(names) != 31) {
			t.Errorf("page %d: remainingItemCount %v with %d items after %d", page, resp.RemainingItemCount, len(resp.Items), len(names))
		}
		for _, k := range resp.Keys {
			names = append(names, k[len("/registry/pods/ns/"):])
		}
		tok = resp.Continue
	}
	want := []string{}
	for i := range 30 {
		want = append(want, fmt.Sprintf("p%02d", i))
		if i == 15 {
			want = append(want, "p15a")
		}
	}
	if !slices.Equal(names, want) {
		t.Errorf("the list's names\n%v\nwant\n%v", names, want)
	}

	// A list at the compacted revision exactly: 410, no token.
	_, err = list(&heraldv1.ListRequest{Limit: 10, ResourceVersion: fmt.Sprint(first.Revision), ResourceVersionMatch: "Exact"})
	if st := kube.StatusOf(kube.FromGRPC(err)); st.Code != http.StatusGone || st.Message != "The resourceVersion for the provided list is too old." || st.ListMeta.Continue != "" {
		t.Errorf("exact list at %d after the compaction: %v, Status %+v", first.Revision, err, st)
	}
	// At the compaction revision itself etcd still reads: served.
	if resp, err := list(&heraldv1.ListRequest{Limit: 10, ResourceVersion: fmt.Sprint(last), ResourceVersionMatch: "Exact"}); err != nil || resp.Revision != last {
		t.Errorf("exact list at the compaction revision %d: %v", last, err)
	}
}

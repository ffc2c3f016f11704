package kubeapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
)

// Media types, as client-go, kubectl and the metadata client send them.
const (
	mediaJSON     = "application/json"
	mediaProtobuf = "application/vnd.kubernetes.protobuf"
	asMeta        = ";as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
	asMetaList    = ";as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
	// acceptTable is what kubectl get sends.
	acceptTable = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)

// scheme decodes every protobuf answer: client-go's built-in kinds, the
// CRD and APIService kinds, and meta.k8s.io's PartialObjectMetadata(List)
// and Table.
var (
	scheme = func() *runtime.Scheme {
		s := runtime.NewScheme()
		for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, apiregistrationv1.AddToScheme} {
			if err := add(s); err != nil {
				panic(err)
			}
		}
		metav1.AddMetaToScheme(s)
		metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
		return s
	}()
	codecs = serializer.NewCodecFactory(scheme)
)

// view is one server's answer to a request, prepared for comparison.
type view struct {
	status int
	ctype  string
	// auditIDs is the number of Audit-Id headers: kube-apiserver's
	// answers carry one.
	auditIDs int
	// norm is compared: the body with the list-level resourceVersion and
	// continue token masked (JSON), or the decoded objects (protobuf, in
	// objs, then norm is their JSON form for messages).
	norm  []byte
	objs  []runtime.Object
	rv    string   // list-level metadata.resourceVersion, "" if none
	cont  string   // list-level continue token
	items [][]byte // items, rows or watch events, for pointing at a difference
	note  string   // what went wrong reading the answer (part of the comparison)
}

// respView is the view of an HTTP answer with body (read, or nil).
func respView(resp *http.Response, body []byte) view {
	return view{status: resp.StatusCode, ctype: resp.Header.Get("Content-Type"), auditIDs: len(resp.Header.Values("Audit-Id")), norm: body}
}

func (v view) equal(o view) bool {
	if v.status != o.status || v.ctype != o.ctype || v.auditIDs != o.auditIDs || v.note != o.note || !bytes.Equal(v.norm, o.norm) || len(v.objs) != len(o.objs) {
		return false
	}
	for i := range v.objs {
		if !equality.Semantic.DeepEqual(v.objs[i], o.objs[i]) {
			return false
		}
	}
	return true
}

// diff says how Herald's answer h differs from kube-apiserver's k.
func diff(k, h view) string {
	switch {
	case k.status != h.status:
		return fmt.Sprintf("status: kube-apiserver %d, Herald %d\nkube-apiserver: %s\nHerald:         %s", k.status, h.status, clip(k.norm, 300), clip(h.norm, 300))
	case k.ctype != h.ctype:
		return fmt.Sprintf("Content-Type: kube-apiserver %q, Herald %q", k.ctype, h.ctype)
	case k.auditIDs != h.auditIDs:
		return fmt.Sprintf("Audit-Id headers: kube-apiserver %d, Herald %d", k.auditIDs, h.auditIDs)
	case k.note != h.note:
		return fmt.Sprintf("kube-apiserver: %s\nHerald: %s", orOK(k.note), orOK(h.note))
	case len(k.items) != len(h.items):
		return fmt.Sprintf("%d items from kube-apiserver, %d from Herald\nkube-apiserver: %s\nHerald:         %s", len(k.items), len(h.items), names(k.items), names(h.items))
	}
	for i := range k.items {
		if !bytes.Equal(k.items[i], h.items[i]) {
			return fmt.Sprintf("item %d differs:\n%s", i, byteDiff(k.items[i], h.items[i]))
		}
	}
	if !bytes.Equal(k.norm, h.norm) {
		return "outside the items:\n" + byteDiff(k.norm, h.norm)
	}
	return "the decoded objects differ semantically:\n" + byteDiff(k.norm, h.norm)
}

func orOK(s string) string {
	if s == "" {
		return "complete"
	}
	return s
}

// byteDiff shows both texts around their first difference.
func byteDiff(a, b []byte) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	from := max(i-120, 0)
	return fmt.Sprintf("at byte %d\nkube-apiserver: …%s\nHerald:         …%s", i, clip(a[from:], 400), clip(b[from:], 400))
}

func clip(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

var nameRE = regexp.MustCompile(`"name":"([^"]*)"`)

func names(items [][]byte) string {
	var out []string
	for _, it := range items {
		m := nameRE.FindSubmatch(it)
		if m == nil {
			out = append(out, "?")
			continue
		}
		out = append(out, string(m[1]))
	}
	return strings.Join(out, " ")
}

// fetcher asks one server (base URL) for something and prepares the answer.
type fetcher func(ctx context.Context, base string) (view, error)

// agreeOpts say how a triple of answers is judged.
type agreeOpts struct {
	// listRV: the answers are consistent lists; Herald's resourceVersion
	// must lie between kube-apiserver's two.
	listRV bool
	// stale: a legitimately stale read (resourceVersion=0): Herald may
	// answer from an older state, so a difference is retried.
	stale bool
}

// check is one comparison: a request both servers answer, and how.
type check struct {
	name  string
	fetch fetcher
	opts  agreeOpts
}

// runChecks runs the checks concurrently (at most 16 at a time) and reports
// each in a subtest of its own, in order.
func (f *fixture) runChecks(t *testing.T, checks []check) {
	t.Helper()
	verdicts := make([]chan string, len(checks))
	sem := make(chan struct{}, 16)
	for i, c := range checks {
		verdicts[i] = make(chan string, 1)
		go func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			verdicts[i] <- f.judge(t.Context(), c.fetch, c.opts)
		}()
	}
	for i, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			if v := <-verdicts[i]; v != "" {
				t.Error(v)
			}
		})
	}
}

// judge compares Herald's answer with kube-apiserver's (see the package
// doc): kube-apiserver, Herald, kube-apiserver again; judged only when
// kube-apiserver answered the same twice, or when Herald's answer differs
// from both in what cannot change with time (status, completeness). It
// returns "" when they agree, else what differs.
func (f *fixture) judge(ctx context.Context, fetch fetcher, o agreeOpts) string {
	const attempts = 6
	var last string
	for range attempts {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		k1, err1 := fetch(ctx, f.kubeURL)
		h, errH := fetch(ctx, f.heraldURL)
		k2, err2 := fetch(ctx, f.kubeURL)
		cancel()
		if err := errors.Join(err1, err2); err != nil {
			return fmt.Sprintf("asking kube-apiserver: %v", err)
		}
		if errH != nil {
			return fmt.Sprintf("asking Herald: %v", errH)
		}
		stable := k1.status == k2.status && k1.ctype == k2.ctype && k1.note == k2.note
		if !k1.equal(k2) {
			if stable && (h.status != k1.status || h.ctype != k1.ctype || h.note != k1.note) {
				return "Herald answers differently from kube-apiserver: " + diff(k1, h)
			}
			last = diff(k1, k2)
			continue
		}
		if !k1.equal(h) {
			if o.stale && h.status == k1.status && h.ctype == k1.ctype && h.note == k1.note {
				last = diff(k1, h)
				continue
			}
			return "Herald answers differently from kube-apiserver: " + diff(k1, h)
		}
		if o.listRV && k1.rv != "" {
			lo, _ := strconv.ParseInt(k1.rv, 10, 64)
			hi, _ := strconv.ParseInt(k2.rv, 10, 64)
			got, err := strconv.ParseInt(h.rv, 10, 64)
			if err != nil || got < lo || got > hi {
				return fmt.Sprintf("list resourceVersion: Herald %q, not within kube-apiserver's %s..%s (both consistent reads)", h.rv, k1.rv, k2.rv)
			}
		}
		return ""
	}
	if o.stale {
		return fmt.Sprintf("Herald's answer never matched kube-apiserver's in %d attempts; last difference: %s", attempts, last)
	}
	return fmt.Sprintf("kube-apiserver's answer kept changing, nothing compared in %d attempts; last change: %s", attempts, last)
}

// request is one HTTP GET.
func (f *fixture) request(ctx context.Context, base, path string, q url.Values, accept string) (*http.Response, error) {
	u := base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	return f.http.Do(req)
}

// fetchJSON reads a GET or LIST answer in a JSON form (JSON objects,
// PartialObjectMetadata, Tables).
func (f *fixture) fetchJSON(path string, q url.Values, accept string) fetcher {
	return func(ctx context.Context, base string) (view, error) {
		resp, body, err := f.readAll(ctx, base, path, q, accept)
		if err != nil {
			return view{}, err
		}
		return jsonView(resp, body), nil
	}
}

// readAll performs a GET and reads the whole answer.
func (f *fixture) readAll(ctx context.Context, base, path string, q url.Values, accept string) (*http.Response, []byte, error) {
	resp, err := f.request(ctx, base, path, q, accept)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

var (
	currentRE  = regexp.MustCompile(`current: \d+`)
	listRVRE   = regexp.MustCompile(`"resourceVersion":"[^"]*"`)
	continueRE = regexp.MustCompile(`"continue":"[^"]*"`)
)

// jsonView masks a list's resourceVersion and continue token (in its
// top-level metadata only) and splits out its items or rows.
func jsonView(resp *http.Response, body []byte) view {
	v := respView(resp, body)
	var top map[string]json.RawMessage
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &top) != nil {
		return v
	}
	list, ok := top["items"]
	if !ok {
		list, ok = top["rows"]
	}
	if !ok {
		return v
	}
	var items []json.RawMessage
	json.Unmarshal(list, &items)
	for _, it := range items {
		v.items = append(v.items, it)
	}
	md := top["metadata"]
	var lm metav1.ListMeta
	json.Unmarshal(md, &lm)
	v.rv, v.cont = lm.ResourceVersion, lm.Continue
	masked := listRVRE.ReplaceAll(md, []byte(`"resourceVersion":"<rv>"`))
	masked = continueRE.ReplaceAll(masked, []byte(`"continue":"<continue>"`))
	if i := bytes.Index(body, md); i >= 0 {
		v.norm = append(append(append([]byte{}, body[:i]...), masked...), body[i+len(md):]...)
	}
	return v
}

// fetchPages reads a whole list in pages of limit, following continue
// tokens; the pages are compared one after the other.
func (f *fixture) fetchPages(path string, q url.Values, accept string, limit int) fetcher {
	return f.pages(path, q, accept, limit, false)
}

// fetchPagesCrossed is fetchPages with the first page asked of the other
// server: each server continues the list the other started, with the
// other's continue token (as when a client moves between them mid-list).
func (f *fixture) fetchPagesCrossed(path string, q url.Values, accept string, limit int) fetcher {
	return f.pages(path, q, accept, limit, true)
}

func (f *fixture) pages(path string, q url.Values, accept string, limit int, crossed bool) fetcher {
	return func(ctx context.Context, base string) (view, error) {
		var out view
		q := cloneValues(q)
		q.Set("limit", strconv.Itoa(limit))
		for page := 0; ; page++ {
			from := base
			if crossed && page == 0 {
				from = f.kubeURL
				if base == f.kubeURL {
					from = f.heraldURL
				}
			}
			v, err := f.fetchJSON(path, q, accept)(ctx, from)
			if err != nil {
				return view{}, err
			}
			if page == 0 {
				out.rv, out.ctype = v.rv, v.ctype
			}
			out.status = v.status
			out.norm = append(append(out.norm, fmt.Sprintf("\n--- page %d ---\n", page)...), v.norm...)
			out.items = append(out.items, v.items...)
			if v.status != http.StatusOK || v.cont == "" {
				return out, nil
			}
			if page == 100 {
				out.note = "more than 100 pages"
				return out, nil
			}
			// As client-go's pager: the next page names only the token.
			q.Del("resourceVersion")
			q.Del("resourceVersionMatch")
			q.Set("continue", v.cont)
		}
	}
}

func cloneValues(q url.Values) url.Values {
	out := url.Values{}
	for k, v := range q {
		out[k] = append([]string(nil), v...)
	}
	return out
}

// fetchProtobuf reads a GET or LIST answer in protobuf and decodes it.
func (f *fixture) fetchProtobuf(path string, q url.Values, accept string) fetcher {
	return func(ctx context.Context, base string) (view, error) {
		resp, body, err := f.readAll(ctx, base, path, q, accept)
		if err != nil {
			return view{}, err
		}
		v := respView(resp, body)
		if resp.StatusCode != http.StatusOK {
			return v, nil
		}
		o, _, err := codecs.UniversalDeserializer().Decode(body, nil, nil)
		if err != nil {
			v.note = "undecodable protobuf: " + err.Error()
			return v, nil
		}
		if meta.IsListType(o) {
			lm, err := meta.ListAccessor(o)
			if err == nil {
				v.rv = lm.GetResourceVersion()
				lm.SetResourceVersion("<rv>")
				if lm.GetContinue() != "" {
					lm.SetContinue("<continue>")
				}
			}
			items, _ := meta.ExtractList(o)
			for _, it := range items {
				b, _ := json.Marshal(it)
				v.items = append(v.items, b)
			}
		}
		v.objs = []runtime.Object{o}
		v.norm, _ = json.Marshal(o)
		return v, nil
	}
}

// watchOpts: how long a watch is read at most before its answer is judged
// incomplete.
const watchWait = 5 * time.Second

// fetchWatchJSON reads a JSON watch (objects, PartialObjectMetadata or
// Tables) from q's resourceVersion until the event at or after marker; with
// no marker (a WatchList request), until the bookmark that ends the initial
// events, whose resourceVersion is then treated as a list's.
func (f *fixture) fetchWatchJSON(path string, q url.Values, accept, marker string) fetcher {
	stop, _ := strconv.ParseInt(marker, 10, 64)
	return func(ctx context.Context, base string) (view, error) {
		ctx, cancel := context.WithTimeout(ctx, watchWait)
		defer cancel()
		q := cloneValues(q)
		if !q.Has("watch") {
			q.Set("watch", "true")
		}
		resp, err := f.request(ctx, base, path, q, accept)
		if err != nil {
			return view{}, err
		}
		defer resp.Body.Close()
		v := respView(resp, nil)
		if resp.StatusCode != http.StatusOK {
			v.norm, _ = io.ReadAll(resp.Body)
			return v, nil
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			line := append([]byte(nil), sc.Bytes()...)
			v.items = append(v.items, line)
			v.norm = append(append(v.norm, line...), '\n')
			var ev struct {
				Type   string `json:"type"`
				Object struct {
					Kind     string            `json:"kind"`
					Metadata metav1.ObjectMeta `json:"metadata"`
					Rows     []struct {
						Object struct {
							Metadata metav1.ObjectMeta `json:"metadata"`
						} `json:"object"`
					} `json:"rows"`
				} `json:"object"`
			}
			if err := json.Unmarshal(line, &ev); err != nil {
				v.note = "undecodable event: " + err.Error()
				return v, nil
			}
			rv := ev.Object.Metadata.ResourceVersion
			if len(ev.Object.Rows) > 0 {
				rv = ev.Object.Rows[0].Object.Metadata.ResourceVersion
			}
			if ev.Type == "ERROR" {
				v.note = "ERROR event"
				return v, nil
			}
			if marker == "" && ev.Type == "BOOKMARK" && ev.Object.Metadata.Annotations["k8s.io/initial-events-end"] == "true" {
				v.rv = rv
				masked := listRVRE.ReplaceAll(line, []byte(`"resourceVersion":"<rv>"`))
				v.items[len(v.items)-1] = masked
				v.norm = append(v.norm[:len(v.norm)-len(line)-1], append(masked, '\n')...)
				return v, nil
			}
			if n, _ := strconv.ParseInt(rv, 10, 64); marker != "" && n >= stop {
				return v, nil
			}
		}
		v.note = fmt.Sprintf("stream ended or timed out (%s) after %d events, before the marker at %q", watchWait, len(v.items), marker)
		return v, nil
	}
}

// fetchWatchProtobuf reads a protobuf watch with client-go's own decoder
// until the event at or after marker.
func (f *fixture) fetchWatchProtobuf(path string, q url.Values, accept, marker string) fetcher {
	stop, _ := strconv.ParseInt(marker, 10, 64)
	return func(ctx context.Context, base string) (view, error) {
		ctx, cancel := context.WithTimeout(ctx, watchWait)
		defer cancel()
		cfg := f.kubeCfg
		if base == f.heraldURL {
			cfg = f.heraldCfg
		}
		cfg = rest.CopyConfig(cfg)
		cfg.GroupVersion = &schema.GroupVersion{}
		cfg.NegotiatedSerializer = codecs.WithoutConversion()
		cfg.ContentType, cfg.AcceptContentTypes = mediaProtobuf, accept
		rc, err := rest.RESTClientFor(cfg)
		if err != nil {
			return view{}, err
		}
		req := rc.Get().AbsPath(path).Param("watch", "true")
		for k, vs := range q {
			for _, val := range vs {
				req = req.Param(k, val)
			}
		}
		w, err := req.Watch(ctx)
		if err != nil {
			var se apierrors.APIStatus
			if errors.As(err, &se) {
				return view{status: int(se.Status().Code), norm: []byte(se.Status().Reason)}, nil
			}
			return view{status: -1, note: err.Error()}, nil
		}
		defer w.Stop()
		v := view{status: http.StatusOK}
		for ev := range w.ResultChan() {
			b, _ := json.Marshal(ev.Object)
			line := append([]byte(string(ev.Type)+" "), b...)
			v.items = append(v.items, line)
			v.norm = append(append(v.norm, line...), '\n')
			v.objs = append(v.objs, ev.Object)
			if ev.Type == watch.Error {
				v.note = "ERROR event"
				return v, nil
			}
			if m, err := meta.Accessor(ev.Object); err == nil {
				if n, _ := strconv.ParseInt(m.GetResourceVersion(), 10, 64); n >= stop {
					return v, nil
				}
			}
		}
		v.note = fmt.Sprintf("stream ended or timed out (%s) after %d events, before the marker at %s", watchWait, len(v.items), marker)
		return v, nil
	}
}

// statusView is an error answer: HTTP status, the Status's code and
// reason; the message separately.
type statusView struct {
	status  int
	code    int32
	reason  metav1.StatusReason
	message string
	body    string
}

func (f *fixture) fetchStatus(ctx context.Context, base, path string, q url.Values, accept string) (statusView, error) {
	resp, err := f.request(ctx, base, path, q, accept)
	if err != nil {
		return statusView{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 300 {
		// Possibly a watch stream: its status is the answer.
		return statusView{status: resp.StatusCode}, nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var s metav1.Status
	json.Unmarshal(b, &s)
	return statusView{status: resp.StatusCode, code: s.Code, reason: s.Reason, message: s.Message, body: clip(b, 300)}, nil
}

// agreeStatus compares the answers to a request both servers must refuse
// (or answer) the same way: status, code and reason; the message in a
// subtest of its own.
func (f *fixture) agreeStatus(t *testing.T, path string, q url.Values, accept string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	k, err := f.fetchStatus(ctx, f.kubeURL, path, q, accept)
	if err != nil {
		t.Fatalf("asking kube-apiserver: %v", err)
	}
	h, err := f.fetchStatus(ctx, f.heraldURL, path, q, accept)
	if err != nil {
		t.Fatalf("asking Herald: %v", err)
	}
	if k.status != h.status || k.code != h.code || k.reason != h.reason {
		t.Errorf("GET %s?%s: kube-apiserver %d %d %q, Herald %d %d %q\nkube-apiserver: %s\nHerald:         %s",
			path, q.Encode(), k.status, k.code, k.reason, h.status, h.code, h.reason, k.body, h.body)
		return
	}
	if k.status < 300 {
		return
	}
	t.Run("message", func(t *testing.T) {
		// A message may name etcd's current revision, which moves.
		if currentRE.ReplaceAllString(k.message, "current: N") != currentRE.ReplaceAllString(h.message, "current: N") {
			t.Errorf("message: kube-apiserver %q, Herald %q", k.message, h.message)
		}
	})
}

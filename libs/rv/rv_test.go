package rv

import (
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in   string
		want Version
		err  error
	}{
		{"", Version{Kind: Unset}, nil},
		{"0", Version{Kind: Any}, nil},
		{"1", Version{Kind: At, Rev: 1}, nil},
		{"9223372036854775807", Version{Kind: At, Rev: 9223372036854775807}, nil},
		{"9223372036854775808", Version{}, ErrMalformed},
		{"abc", Version{}, ErrMalformed},
		{"-1", Version{}, ErrMalformed},
		{"+1", Version{}, ErrMalformed},
		{"01", Version{}, ErrMalformed},
		{" 1", Version{}, ErrMalformed},
		{"1 ", Version{}, ErrMalformed},
		{"1.5", Version{}, ErrMalformed},
	}
	for _, tt := range tests {
		got, err := Parse(tt.in)
		if !errors.Is(err, tt.err) || (err == nil && tt.err != nil) {
			t.Errorf("Parse(%q) error = %v, want %v", tt.in, err, tt.err)
			continue
		}
		if got != tt.want {
			t.Errorf("Parse(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
		if err == nil && got.String() != tt.in {
			t.Errorf("Parse(%q).String() = %q", tt.in, got.String())
		}
	}
}

func TestPlanList(t *testing.T) {
	tok := After("/registry/pods/a/b", 42).Encode("/registry/pods/")
	tests := []struct {
		name          string
		rv, match, co string
		limit         int64
		want          ListPlan
		err           error
	}{
		{"unset", "", "", "", 0, ListPlan{Mode: ListConsistent}, nil},
		{"unset limit", "", "", "", 10, ListPlan{Mode: ListConsistent, Limit: 10}, nil},
		{"zero ignores limit", "0", "", "", 10, ListPlan{Mode: ListAny}, nil},
		{"zero not older", "0", "NotOlderThan", "", 0, ListPlan{Mode: ListAny}, nil},
		{"n", "7", "", "", 0, ListPlan{Mode: ListNotOlderThan, Rev: 7}, nil},
		{"n limit is exact", "7", "", "", 5, ListPlan{Mode: ListExact, Rev: 7, Limit: 5}, nil},
		{"n not older limit", "7", "NotOlderThan", "", 5, ListPlan{Mode: ListNotOlderThan, Rev: 7, Limit: 5}, nil},
		{"n not older", "7", "NotOlderThan", "", 0, ListPlan{Mode: ListNotOlderThan, Rev: 7}, nil},
		{"n exact", "7", "Exact", "", 3, ListPlan{Mode: ListExact, Rev: 7, Limit: 3}, nil},
		{"continue", "", "", tok, 3, ListPlan{Mode: ListContinue, Rev: 42, Limit: 3, Token: Token{Rev: 42, Start: "/registry/pods/a/b\x00"}}, nil},
		{"continue rv0", "0", "", tok, 3, ListPlan{Mode: ListContinue, Rev: 42, Limit: 3, Token: Token{Rev: 42, Start: "/registry/pods/a/b\x00"}}, nil},
		{"continue with rv", "5", "", tok, 3, ListPlan{}, ErrContinueWithResourceVersion},
		{"continue with bad rv", "x", "", tok, 3, ListPlan{}, ErrContinueWithResourceVersion},
		{"bad continue with rv", "5", "", "!!", 3, ListPlan{}, ErrMalformed},
		{"continue with match", "5", "Exact", tok, 3, ListPlan{}, ErrContinueWithResourceVersion}, // frontdoor refuses it first (422, ValidateListOptions)
		{"bad continue", "", "", "!!", 3, ListPlan{}, ErrMalformed},
		{"match without rv", "", "Exact", "", 0, ListPlan{}, ErrInvalidCombination},
		{"exact zero", "0", "Exact", "", 0, ListPlan{}, ErrInvalidCombination},
		{"unknown match", "5", "Newest", "", 0, ListPlan{}, ErrInvalidCombination},
		{"bad rv", "x", "", "", 0, ListPlan{}, ErrMalformed},
		{"negative limit", "", "", "", -1, ListPlan{}, ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := PlanList(tt.rv, tt.match, tt.co, tt.limit, "/registry/pods/")
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("error = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestPlanWatch(t *testing.T) {
	yes, no := true, false
	tests := []struct {
		name      string
		rv, match string
		sie       *bool
		bookmarks bool
		want      WatchPlan
		err       error
	}{
		{"unset", "", "", nil, false, WatchPlan{Mode: WatchFromState, Consistent: true}, nil},
		{"zero", "0", "", nil, false, WatchPlan{Mode: WatchFromState}, nil},
		{"n", "12", "", nil, true, WatchPlan{Mode: WatchAfter, Rev: 12}, nil},
		{"watchlist unset", "", "NotOlderThan", &yes, true, WatchPlan{Mode: WatchFromState, Consistent: true, InitialEventsEnd: true}, nil},
		{"watchlist zero", "0", "NotOlderThan", &yes, true, WatchPlan{Mode: WatchFromState, InitialEventsEnd: true}, nil},
		{"watchlist n", "9", "NotOlderThan", &yes, true, WatchPlan{Mode: WatchFromState, Rev: 9, InitialEventsEnd: true}, nil},
		{"watchlist needs bookmarks", "", "NotOlderThan", &yes, false, WatchPlan{}, ErrInvalidCombination},
		{"watchlist needs match", "", "", &yes, true, WatchPlan{}, ErrInvalidCombination},
		{"sie false unset", "", "NotOlderThan", &no, false, WatchPlan{Mode: WatchFromNow, Consistent: true}, nil},
		{"sie false zero", "0", "NotOlderThan", &no, false, WatchPlan{Mode: WatchFromNow}, nil},
		{"sie false n", "4", "NotOlderThan", &no, false, WatchPlan{Mode: WatchAfter, Rev: 4}, nil},
		{"match without sie", "4", "NotOlderThan", nil, false, WatchPlan{}, ErrInvalidCombination},
		{"exact match", "4", "Exact", &yes, true, WatchPlan{}, ErrInvalidCombination},
		{"bad rv", "abc", "", nil, false, WatchPlan{}, ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := PlanWatch(tt.rv, tt.match, tt.sie, tt.bookmarks)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("error = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestTokenRoundTrip: tokens are kube-apiserver's, byte for byte, and read
// as it reads them, errors included.
func TestTokenRoundTrip(t *testing.T) {
	const prefix = "/registry/pods/"
	in := After("/registry/pods/ns-1/web-0", 99)
	enc := in.Encode(prefix)
	// What kube-apiserver's watch cache writes (k8s.io/apiserver's
	// storage.EncodeContinue, relative to the list's key "/pods") for the
	// key after ns-1/web-0, at revision 99.
	if want := base64.RawURLEncoding.EncodeToString([]byte(`{"v":"meta.k8s.io/v1","rv":99,"start":"/ns-1/web-0\u0000"}`)); enc != want {
		t.Errorf("Encode = %s, want %s", enc, want)
	}
	// Its etcd reads write the key relative to "/registry/pods/": the same
	// token.
	etcd := base64.RawURLEncoding.EncodeToString([]byte(`{"v":"meta.k8s.io/v1","rv":99,"start":"ns-1/web-0\u0000"}`))
	if out, err := DecodeToken(etcd, prefix); err != nil || out != in {
		t.Errorf("DecodeToken(kube-apiserver's etcd form) = %+v, %v; want %+v", out, err, in)
	}
	if out, err := DecodeToken(enc, prefix); err != nil || out != in {
		t.Fatalf("round trip = %+v, %v; want %+v", out, err, in)
	}
	// Within a namespace, the start key is the name's.
	if out, err := DecodeToken(in.Encode(prefix+"ns-1/"), prefix+"ns-1/"); err != nil || out != in {
		t.Fatalf("namespaced round trip = %+v, %v; want %+v", out, err, in)
	}
	// kube-apiserver's watch cache writes the start key with a leading
	// slash.
	slashed := base64.RawURLEncoding.EncodeToString([]byte(`{"v":"meta.k8s.io/v1","rv":99,"start":"/ns-1/web-0\u0000"}`))
	if out, err := DecodeToken(slashed, prefix); err != nil || out != in {
		t.Fatalf("leading slash = %+v, %v; want %+v", out, err, in)
	}
	// The prefix itself: the whole list.
	whole := Token{Rev: 5, Start: prefix}
	if out, err := DecodeToken(whole.Encode(prefix), prefix); err != nil || out != whole {
		t.Fatalf("start at the prefix = %+v, %v; want %+v", out, err, whole)
	}
	// A negative revision asks for the latest state.
	latest := base64.RawURLEncoding.EncodeToString([]byte(`{"v":"meta.k8s.io/v1","rv":-1,"start":"ns-1/web-0\u0000"}`))
	if out, err := DecodeToken(latest, prefix); err != nil || out != (Token{Rev: 0, Start: in.Start}) {
		t.Fatalf("negative revision = %+v, %v", out, err)
	}
	b64 := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for _, tc := range []struct{ token, msg string }{
		{"", "continue key is not valid: unexpected end of JSON input"},
		{"!!", "continue key is not valid: illegal base64 data at input byte 0"},
		{enc + "=", "continue key is not valid: illegal base64 data at input byte " + strconv.Itoa(len(enc))},
		{b64(`{}`), "continue key is not valid: server does not recognize this encoded version "},
		{b64(`{"v":"herald/v1","rv":1,"after":"/registry/pods/a/b"}`), "continue key is not valid: server does not recognize this encoded version herald/v1"},
		{b64(`{"v":"meta.k8s.io/v1","start":"a"}`), "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"},
		{b64(`{"v":"meta.k8s.io/v1","rv":1}`), "continue key is not valid: encoded start key empty (version meta.k8s.io/v1)"},
		{b64(`{"v":"meta.k8s.io/v1","rv":1,"start":"../secrets/a"}`), "continue key is not valid: ../secrets/a"},
		{b64(`{"v":"meta.k8s.io/v1","rv":1,"start":"a//b"}`), "continue key is not valid: a//b"},
	} {
		_, err := DecodeToken(tc.token, prefix)
		if !errors.Is(err, ErrMalformed) || err.Error() != tc.msg {
			t.Errorf("DecodeToken(%q) error = %v, want %q (ErrMalformed)", tc.token, err, tc.msg)
		}
	}
}

func FuzzDecodeToken(f *testing.F) {
	const prefix = "/registry/pods/"
	f.Add(After("/registry/pods/a/b", 1).Encode(prefix))
	f.Add("")
	f.Add("eyJ2IjoiaGVyYWxkL3YxIiwicnYiOjEsImFmdGVyIjoiLyJ9")
	f.Add(base64.RawURLEncoding.EncodeToString([]byte(`{"v":"meta.k8s.io/v1","rv":3,"start":"/"}`)))
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := DecodeToken(s, prefix)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		if !strings.HasPrefix(tok.Start, prefix) {
			t.Fatalf("%q decodes to a start key outside the prefix: %+v", s, tok)
		}
		again, err := DecodeToken(tok.Encode(prefix), prefix)
		if err != nil || again != tok {
			t.Fatalf("re-encode of %+v = %+v, %v", tok, again, err)
		}
	})
}

func FuzzPlan(f *testing.F) {
	f.Add("5", "Exact", "", int64(1))
	f.Add("", "", "", int64(0))
	f.Fuzz(func(t *testing.T, rvs, match, cont string, limit int64) {
		if _, err := PlanList(rvs, match, cont, limit, "/registry/pods/"); err != nil && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrInvalidCombination) {
			t.Fatalf("unclassified error %v", err)
		}
		b := limit%2 == 0
		if _, err := PlanWatch(rvs, match, &b, b); err != nil && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrInvalidCombination) {
			t.Fatalf("unclassified error %v", err)
		}
	})
}

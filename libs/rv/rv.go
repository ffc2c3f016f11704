// Package rv owns the meaning of Kubernetes resourceVersions in Herald:
// parsing them, the rules that combine resourceVersion, resourceVersionMatch,
// sendInitialEvents and continue into one LIST or WATCH plan, and the opaque
// continue tokens of paginated lists.
//
// A resourceVersion served by Herald is the decimal etcd revision of the
// change (or list) it names. The package is pure logic: it never blocks, never
// allocates beyond its results and never panics on client input.
package rv

import (
	"errors"
	"fmt"
	"strconv"
)

// Errors are classified so that the HTTP layer can map them to a Kubernetes
// Status in one place.
var (
	// ErrMalformed: a value could not be parsed (HTTP 400 BadRequest).
	ErrMalformed = errors.New("malformed")
	// ErrContinueWithResourceVersion: a continue token and a
	// resourceVersion other than "0" (an ErrMalformed, in kube-apiserver's
	// words: HTTP 400).
	ErrContinueWithResourceVersion error = malformed("specifying resource version is not allowed when using continue")
	// ErrInvalidCombination: well-formed values that may not be combined
	// (HTTP 422 Invalid, as kube-apiserver's option validation answers).
	ErrInvalidCombination = errors.New("invalid combination")
)

// malformed is an ErrMalformed whose text is the client's.
type malformed string

func (e malformed) Error() string { return string(e) }

// Is makes it an ErrMalformed.
func (e malformed) Is(target error) bool { return target == ErrMalformed }

// Kind says which of the three resourceVersion forms a request carried.
type Kind uint8

const (
	// Unset: no resourceVersion; the most recent state (a consistent read).
	Unset Kind = iota
	// Any: "0"; any state the server has, however old.
	Any
	// At: a positive revision.
	At
)

// Version is a parsed resourceVersion.
type Version struct {
	Kind Kind
	// Rev is the revision for At, 0 otherwise.
	Rev int64
}

// Parse parses a client's resourceVersion parameter.
func Parse(s string) (Version, error) {
	switch s {
	case "":
		return Version{Kind: Unset}, nil
	case "0":
		return Version{Kind: Any}, nil
	}
	// Reject signs, spaces and leading zeros: a resourceVersion is exactly a
	// revision as Herald printed it.
	if len(s) > 19 || s[0] < '1' || s[0] > '9' {
		return Version{}, fmt.Errorf("%w: resourceVersion %q is not a valid resource version", ErrMalformed, s)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return Version{}, fmt.Errorf("%w: resourceVersion %q is not a valid resource version", ErrMalformed, s)
	}
	return Version{Kind: At, Rev: n}, nil
}

// String returns the parameter form of v.
func (v Version) String() string {
	switch v.Kind {
	case Any:
		return "0"
	case At:
		return Format(v.Rev)
	}
	return ""
}

// Format renders a revision as a resourceVersion.
func Format(rev int64) string { return strconv.FormatInt(rev, 10) }

// Match is the resourceVersionMatch parameter.
type Match string

const (
	MatchNone         Match = ""
	MatchNotOlderThan Match = "NotOlderThan"
	MatchExact        Match = "Exact"
)

// ListMode is how a LIST must be answered.
type ListMode uint8

const (
	// ListConsistent: reflect at least etcd's current revision.
	ListConsistent ListMode = iota
	// ListAny: whatever the cache holds now; limit is ignored (as
	// kube-apiserver does for resourceVersion=0).
	ListAny
	// ListNotOlderThan: at least Rev; wait for the cache to reach it.
	ListNotOlderThan
	// ListExact: exactly at Rev.
	ListExact
	// ListContinue: the next page of a paginated list at Token.Rev (0: at
	// the latest revision, as a consistent read).
	ListContinue
)

// ListPlan is the validated meaning of a LIST request's parameters.
type ListPlan struct {
	Mode  ListMode
	Rev   int64
	Limit int64
	// Token is set for ListContinue.
	Token Token
}

// PlanList validates a LIST's resourceVersion, resourceVersionMatch, limit and
// continue parameters and returns what must be served; prefix is the key
// prefix of what is listed (see DecodeToken).
func PlanList(resourceVersion, match, cont string, limit int64, prefix string) (ListPlan, error) {
	if limit < 0 {
		return ListPlan{}, fmt.Errorf("%w: limit must not be negative", ErrMalformed)
	}
	// kube-apiserver's storage reads the token first, and then refuses any
	// resourceVersion with it but "0" without reading it.
	var tok Token
	if cont != "" {
		var err error
		if tok, err = DecodeToken(cont, prefix); err != nil {
			return ListPlan{}, err
		}
		if resourceVersion != "" && resourceVersion != "0" {
			return ListPlan{}, ErrContinueWithResourceVersion
		}
	}
	v, err := Parse(resourceVersion)
	if err != nil {
		return ListPlan{}, err
	}
	m := Match(match)
	switch m {
	case MatchNone, MatchNotOlderThan, MatchExact:
	default:
		return ListPlan{}, fmt.Errorf("%w: resourceVersionMatch %q is not supported (use %q or %q)", ErrInvalidCombination, match, MatchExact, MatchNotOlderThan)
	}
	if m != MatchNone {
		if v.Kind == Unset {
			return ListPlan{}, fmt.Errorf("%w: resourceVersionMatch is forbidden unless resourceVersion is provided", ErrInvalidCombination)
		}
		if cont != "" {
			return ListPlan{}, fmt.Errorf("%w: resourceVersionMatch is forbidden when continue is provided", ErrInvalidCombination)
		}
		if m == MatchExact && v.Kind == Any {
			return ListPlan{}, fmt.Errorf("%w: resourceVersionMatch %q is forbidden for resourceVersion \"0\"", ErrInvalidCombination, MatchExact)
		}
	}
	if cont != "" {
		return ListPlan{Mode: ListContinue, Rev: tok.Rev, Limit: limit, Token: tok}, nil
	}
	switch {
	case v.Kind == Unset:
		return ListPlan{Mode: ListConsistent, Limit: limit}, nil
	case v.Kind == Any:
		return ListPlan{Mode: ListAny}, nil
	case m == MatchExact, m == MatchNone && limit > 0:
		// A paged list at a resourceVersion without resourceVersionMatch
		// is exact: kube-apiserver's legacy rule, which v1.37 still applies.
		return ListPlan{Mode: ListExact, Rev: v.Rev, Limit: limit}, nil
	default:
		return ListPlan{Mode: ListNotOlderThan, Rev: v.Rev, Limit: limit}, nil
	}
}

// WatchMode is where a WATCH starts.
type WatchMode uint8

const (
	// WatchFromState: first the current state as synthetic ADDED events, then
	// every change after it.
	WatchFromState WatchMode = iota
	// WatchAfter: every change after Rev; no initial state.
	WatchAfter
	// WatchFromNow: every change after the server's current revision.
	WatchFromNow
)

// WatchPlan is the validated meaning of a WATCH request's parameters.
type WatchPlan struct {
	Mode WatchMode
	// Rev: for WatchAfter the revision to start after; for WatchFromState
	// the revision the state must not be older than (0: any).
	Rev int64
	// Consistent: the state (or the starting point) must reflect at least
	// etcd's current revision.
	Consistent bool
	// InitialEventsEnd: end the initial events with a BOOKMARK annotated
	// "k8s.io/initial-events-end" (WatchList).
	InitialEventsEnd bool
}

// PlanWatch validates a WATCH's parameters. sendInitialEvents is nil when
// the client did not send it.
func PlanWatch(resourceVersion, match string, sendInitialEvents *bool, allowBookmarks bool) (WatchPlan, error) {
	v, err := Parse(resourceVersion)
	if err != nil {
		return WatchPlan{}, err
	}
	m := Match(match)
	if sendInitialEvents != nil {
		if m != MatchNotOlderThan {
			return WatchPlan{}, fmt.Errorf("%w: sendInitialEvents requires setting resourceVersionMatch to %s", ErrInvalidCombination, MatchNotOlderThan)
		}
		if *sendInitialEvents && !allowBookmarks {
			return WatchPlan{}, fmt.Errorf("%w: sendInitialEvents requires setting allowWatchBookmarks to true", ErrInvalidCombination)
		}
	} else if m != MatchNone {
		return WatchPlan{}, fmt.Errorf("%w: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided", ErrInvalidCombination)
	}
	if m != MatchNone && m != MatchNotOlderThan {
		return WatchPlan{}, fmt.Errorf("%w: resourceVersionMatch %q is not supported for watch (use %q)", ErrInvalidCombination, match, MatchNotOlderThan)
	}
	if sendInitialEvents != nil {
		if *sendInitialEvents {
			p := WatchPlan{Mode: WatchFromState, InitialEventsEnd: true}
			switch v.Kind {
			case Unset:
				p.Consistent = true
			case At:
				p.Rev = v.Rev
			}
			return p, nil
		}
		switch v.Kind {
		case Unset:
			return WatchPlan{Mode: WatchFromNow, Consistent: true}, nil
		case Any:
			return WatchPlan{Mode: WatchFromNow}, nil
		}
		return WatchPlan{Mode: WatchAfter, Rev: v.Rev}, nil
	}
	switch v.Kind {
	case Unset:
		return WatchPlan{Mode: WatchFromState, Consistent: true}, nil
	case Any:
		return WatchPlan{Mode: WatchFromState}, nil
	}
	return WatchPlan{Mode: WatchAfter, Rev: v.Rev}, nil
}

package authz

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	authorizationcel "k8s.io/apiserver/pkg/authorization/cel"
	"k8s.io/apiserver/plugin/pkg/authorizer/webhook"
	webhookmetrics "k8s.io/apiserver/plugin/pkg/authorizer/webhook/metrics"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"

	"herald.dev/services/frontdoor/internal/upstream"
)

// ReviewAuthorizer is cluster mode's authorizer: a SubjectAccessReview per
// request, sent by k8s.io/apiserver's webhook authorizer (what the
// delegating authorizer of aggregated API servers uses), its decisions
// cached here, by a hash of the review, in a cache bounded in bytes
// (reviewCache).
//
// The webhook authorizer's own cache is an LRU of 8,192 entries keyed by
// the whole review as JSON, selectors included, denials too: 8,192 denied
// requests with large selectors hold 8,192 copies of them (issue 53: 64
// requests with 512 KiB selectors kept 33 MiB). It cannot be turned off, so
// each uncached review is asked of a webhook authorizer of its own, whose
// cache goes with it.
type ReviewAuthorizer struct {
	client            authorizationclient.AuthorizationV1Interface
	backoff           wait.Backoff
	allowTTL, denyTTL time.Duration
	cache             *reviewCache
	metrics           webhookmetrics.AuthorizerMetrics
	compiler          authorizationcel.Compiler
}

// NewReviewAuthorizer sends its reviews with client, caches them as c
// says, and retries a failed review with backoff.
func NewReviewAuthorizer(client authorizationclient.AuthorizationV1Interface, c upstream.Config, backoff wait.Backoff) *ReviewAuthorizer {
	return &ReviewAuthorizer{
		client: client, backoff: backoff, allowTTL: c.AuthzAllowCacheTTL, denyTTL: c.AuthzDenyCacheTTL,
		cache:    newReviewCache(c.AuthzCacheBytes, c.AuthzCacheBytesPerUser),
		metrics:  authorizerfactory.NewDelegatingAuthorizerMetrics(),
		compiler: authorizationcel.NewDefaultCompiler(),
	}
}

var _ authorizer.Authorizer = (*ReviewAuthorizer)(nil)

// Authorize answers from the cache, or asks the cluster and caches its
// decision (allowed for allowTTL, anything else for denyTTL; a failed
// review is not cached).
func (a *ReviewAuthorizer) Authorize(ctx context.Context, attr authorizer.Attributes) (authorizer.Decision, string, error) {
	key := reviewKey(attr)
	if d, reason, ok := a.cache.get(key); ok {
		return d, reason, nil
	}
	w, err := webhook.NewFromInterface(a.client, 0, 0, a.backoff, authorizer.DecisionNoOpinion, a.metrics, a.compiler)
	if err != nil {
		return authorizer.DecisionNoOpinion, "", err
	}
	d, reason, err := w.Authorize(ctx, attr)
	if err != nil {
		return d, reason, err
	}
	ttl := a.denyTTL
	if d == authorizer.DecisionAllow {
		ttl = a.allowTTL
	}
	var who string
	if u := attr.GetUser(); u != nil {
		who = u.GetName()
	}
	a.cache.add(key, who, d, reason, ttl)
	return d, reason, nil
}

// ConditionsAwareAuthorize: not conditions-aware (as the webhook
// authorizer).
func (a *ReviewAuthorizer) ConditionsAwareAuthorize(ctx context.Context, attr authorizer.Attributes) authorizer.ConditionsAwareDecision {
	return authorizer.ConditionsAwareDecisionFromParts(a.Authorize(ctx, attr))
}

// EvaluateConditions is not supported (as by the webhook authorizer).
func (*ReviewAuthorizer) EvaluateConditions(context.Context, authorizer.ConditionsAwareDecision, authorizer.ConditionsData) (authorizer.Decision, string, error) {
	return authorizer.DecisionDeny, "", authorizer.ErrorConditionEvaluationNotSupported
}

// reviewKey is a hash of everything of attr a SubjectAccessReview carries
// (the webhook authorizer's spec: user, UID, groups, extra, and the
// resource or non-resource attributes with the selectors' requirements),
// each field length-prefixed, so that two reviews share a key only if they
// ask the same.
func reviewKey(attr authorizer.Attributes) [sha256.Size]byte {
	k := keyWriter{sha256.New()}
	if u := attr.GetUser(); u != nil {
		k.str(u.GetName())
		k.str(u.GetUID())
		k.strs(u.GetGroups())
		extra := u.GetExtra()
		keys := make([]string, 0, len(extra))
		for e := range extra {
			keys = append(keys, e)
		}
		slices.Sort(keys)
		k.n(len(keys))
		for _, e := range keys {
			k.str(e)
			k.strs(extra[e])
		}
	} else {
		k.str("")
	}
	if !attr.IsResourceRequest() {
		k.str("nonresource")
		k.str(attr.GetPath())
		k.str(attr.GetVerb())
	} else {
		k.str("resource")
		for _, s := range []string{attr.GetNamespace(), attr.GetVerb(), attr.GetAPIGroup(), attr.GetAPIVersion(), attr.GetResource(), attr.GetSubresource(), attr.GetName()} {
			k.str(s)
		}
		fr, _ := attr.GetFieldSelector()
		k.n(len(fr))
		for _, r := range fr {
			k.str(string(r.Operator))
			k.str(r.Field)
			k.str(r.Value)
		}
		lr, _ := attr.GetLabelSelector()
		k.n(len(lr))
		for _, r := range lr {
			k.str(string(r.Operator()))
			k.str(r.Key())
			k.strs(r.ValuesUnsorted())
		}
	}
	var out [sha256.Size]byte
	k.h.Sum(out[:0])
	return out
}

type keyWriter struct{ h hash.Hash }

func (k keyWriter) n(n int) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(n))
	k.h.Write(b[:])
}

func (k keyWriter) str(s string) {
	k.n(len(s))
	k.h.Write([]byte(s))
}

func (k keyWriter) strs(ss []string) {
	k.n(len(ss))
	for _, s := range ss {
		k.str(s)
	}
}

// reviewCache holds decisions by review hash, least recently used evicted
// first, within two budgets in bytes: the whole cache's, and each user's
// share of it, so that one user asking many different reviews (a flood of
// denied requests, each with another selector) evicts its own entries, not
// everyone else's. An entry's size is what it keeps (the reason, the user's
// name) plus entryOverhead for the key, the lists and the map; nothing of
// the request's selectors is kept.
type reviewCache struct {
	mu           sync.Mutex
	max, perUser int64
	bytes        int64
	lru          list.List // of *reviewEntry, most recent first
	entries      map[[sha256.Size]byte]*list.Element
	users        map[string]*userEntries
	now          func() time.Time
}

// entryOverhead is the memory of one entry beyond its strings, estimated
// from Go's allocation sizes: the entry (112 bytes), its two list elements
// (48 each), its map slot with the key (40, up to twice that as the map
// grows). TestReviewCacheBytes checks the heap against it.
const entryOverhead = 320

type reviewEntry struct {
	key      [sha256.Size]byte
	user     string
	decision authorizer.Decision
	reason   string
	expires  time.Time
	size     int64
	inUser   *list.Element // in users[user].lru
}

type userEntries struct {
	bytes int64
	lru   list.List // of *reviewEntry, most recent first
}

func newReviewCache(max, perUser int64) *reviewCache {
	return &reviewCache{max: max, perUser: min(perUser, max), entries: map[[sha256.Size]byte]*list.Element{},
		users: map[string]*userEntries{}, now: time.Now}
}

func (c *reviewCache) get(key [sha256.Size]byte) (authorizer.Decision, string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[key]
	if !ok {
		return 0, "", false
	}
	e := el.Value.(*reviewEntry)
	if !c.now().Before(e.expires) {
		c.remove(el)
		return 0, "", false
	}
	c.lru.MoveToFront(el)
	c.users[e.user].lru.MoveToFront(e.inUser)
	return e.decision, e.reason, true
}

func (c *reviewCache) add(key [sha256.Size]byte, user string, d authorizer.Decision, reason string, ttl time.Duration) {
	size := int64(entryOverhead + len(reason) + len(user))
	if ttl <= 0 || size > c.perUser {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[key]; ok {
		c.remove(el)
	}
	u := c.users[user]
	if u == nil {
		u = &userEntries{}
		c.users[user] = u
	}
	e := &reviewEntry{key: key, user: user, decision: d, reason: reason, expires: c.now().Add(ttl), size: size}
	e.inUser = u.lru.PushFront(e)
	c.entries[key] = c.lru.PushFront(e)
	u.bytes += size
	c.bytes += size
	for u.bytes > c.perUser {
		c.remove(c.entries[u.lru.Back().Value.(*reviewEntry).key])
	}
	for c.bytes > c.max {
		c.remove(c.lru.Back())
	}
}

// remove drops an entry (c.mu held).
func (c *reviewCache) remove(el *list.Element) {
	e := c.lru.Remove(el).(*reviewEntry)
	delete(c.entries, e.key)
	u := c.users[e.user]
	u.lru.Remove(e.inUser)
	u.bytes -= e.size
	c.bytes -= e.size
	if u.lru.Len() == 0 {
		delete(c.users, e.user)
	}
}

// size reports the bytes and entries held.
func (c *reviewCache) size() (bytes int64, entries int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes, len(c.entries)
}

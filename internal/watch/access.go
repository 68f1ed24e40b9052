package watch

import (
	"bytes"
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/upstream"
)

// Access reviews (docs/design.md section 11, "Who shares with whom"): a client that brings its
// own credentials (a bearer token, a verified certificate whose identity watchsan asserts, or
// the lent identity with an impersonation of its own) joins or opens a shared feed only after
// the apiserver said, to a SelfSubjectAccessReview sent with those same credentials and
// impersonation headers through the same transport as its watch, that it may watch exactly
// that scope, selectors included (KEP-4601: the Node authorizer lets a kubelet watch pods only
// with its own spec.nodeName). Anything but status.allowed (a 401, a 403 on the review itself,
// allowed false, an error, a timeout) sends the watch to a private feed: the apiserver then
// answers the client itself, its own 401 or 403, and no byte of a feed reaches it.
//
// A decision about rights is never older than the apiserver's own: RBAC answers from its
// informers' current state (a RoleBinding deleted is refused at once) and token authentication
// caches for about 10 s, so no allowance is kept. Every join is reviewed by a review that
// began after the watch arrived, as ReadIndex batching reads in Raft: identical reviews (same
// credentials, same attributes) coalesce onto the one not yet sent, and a watch arriving while
// one is already on the wire waits for the next, which is sent once that one is answered. So
// at most two reviews of a key are ever outstanding, however many watches arrive. A denial
// (or a 401, 403 or error) is kept for reviewDeniedTTL, bounded in entries, oldest out: reusing
// one only sends a watch to a private feed, where the apiserver decides. A review no watch waits
// for any more (its clients reset their streams) is cancelled and counts for nothing. Keys are
// digests of the credentials and the review's attributes, never a credential in clear.

// Defaults of the review cache.
const (
	// DefaultShareReviewEntries bounds the denied-review cache (--share-access-review-cache-entries).
	DefaultShareReviewEntries = 10000
	// reviewDeniedTTL is the apiserver's webhook authorizer's unauthorized cache lifetime
	// (--authorization-webhook-cache-unauthorized-ttl default): a denial only ever sends a
	// watch to a private feed, where the apiserver answers it itself.
	reviewDeniedTTL = 30 * time.Second
	// reviewTimeout bounds one review, its retries included (the request budget).
	reviewTimeout = upstream.DefaultRetryBudget
)

// reviewPath is where a SelfSubjectAccessReview is created.
const reviewPath = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"

// The values of watchsan_shared_feed_access_reviews_total's result label (ReviewResults): what
// decided one watch's access to a shared feed.
const (
	reviewAllowed      = "allowed"       // the apiserver's review said allowed
	reviewDenied       = "denied"        // the review said not allowed (or denied)
	reviewUnauthorized = "unauthorized"  // the review was answered 401: the credentials are no one's
	reviewForbidden    = "forbidden"     // the review was answered 403: the identity may not even ask
	reviewError        = "error"         // no answer, a timeout, or one watchsan does not read
	reviewCachedDeny   = "cached-denied" // a denial, a 401, 403 or error within reviewDeniedTTL
	reviewCoalesced    = "coalesced"     // took the answer of a review another watch's arrival sent
)

// ReviewResults lists watchsan_shared_feed_access_reviews_total's results (to initialise series).
var ReviewResults = []string{reviewAllowed, reviewDenied, reviewUnauthorized, reviewForbidden, reviewError,
	reviewCachedDeny, reviewCoalesced}

// reviewClientGone is what review says when the watch's client left before its answer: not a
// PrivateFeedReasons value (nothing is served, nothing counted).
const reviewClientGone = "client-gone"

// reviewKey is a digest of the credentials and the review's attributes; credKey one of the
// credentials alone.
type (
	reviewKey [sha256.Size]byte
	credKey   [sha256.Size]byte
)

// reviews is the Handler's reviews in flight and its recent denials.
type reviews struct {
	max int

	mu     sync.Mutex
	denied map[reviewKey]*list.Element // of *deniedEntry
	order  *list.List                  // oldest first
	// flights holds, per key, the review on the wire (sent); a watch that arrives meanwhile
	// waits for its next, which is sent once it is answered.
	flights map[reviewKey]*reviewFlight
}

type deniedEntry struct {
	key   reviewKey
	until time.Time
}

// reviewFlight is one review, sent or to be sent; done is closed once allowed and result are
// set. Its fields but done are guarded by reviews.mu.
type reviewFlight struct {
	done    chan struct{}
	req     *http.Request        // the review request (its first waiter's: every waiter's is the same)
	cred    upstream.Credentials // what it goes with
	waiters int                  // the watches waiting for it
	sent    bool                 // it is on the wire: a watch arriving now waits for next
	next    *reviewFlight        // the review the watches arriving while this one is sent wait for
	cancel  context.CancelFunc   // ends it once no watch waits (set when sent)
	allowed bool
	result  string
}

func newReviews(max int) *reviews {
	return &reviews{max: max, denied: map[reviewKey]*list.Element{}, order: list.New(), flights: map[reviewKey]*reviewFlight{}}
}

// needsReview says whether a watch with cred may share only after an access review: the
// client's own token, its verified certificate's identity asserted, or the lent identity
// impersonating another (reviewed as the impersonated one: the review goes with the same
// headers). The lent identity itself needs none (the lending guard decided who gets it);
// anonymous and undecided credentials never share (an anonymous review may be allowed where
// the anonymous watch is not: the apiserver's anonymous authenticator may be limited to some
// paths).
func needsReview(cred upstream.Credentials) bool {
	_, asserted := cred.Asserted()
	return asserted || cred.Own() || (cred.Lent() && cred.Impersonates())
}

// credentialsKey is a digest of what names the identity a request with cred goes as: its kind
// and principal, and every header that may carry an identity upstream (Authorization, the
// client's own Impersonate-* and X-Remote-*; the transport strips these where it asserts one),
// so two requests with the same key are the same user to the apiserver.
func credentialsKey(r *http.Request, cred upstream.Credentials) credKey {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00", cred.String(), cred.Principal())
	if id, ok := cred.Asserted(); ok {
		fmt.Fprintf(h, "%q\x00%q\x00", id.User, id.Groups)
	}
	names := make([]string, 0, 2)
	for k := range r.Header {
		if k == "Authorization" || strings.HasPrefix(k, "Impersonate-") || strings.HasPrefix(k, "X-Remote-") {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(h, "%s:%q\x00", k, r.Header[k])
	}
	var out credKey
	h.Sum(out[:0])
	return out
}

// reviewAttributes are what the apiserver authorizes the watch r for: verb watch on its group,
// version, resource, subresource, namespace and name, with its label and field selectors (the
// apiserver authorizes selectors since 1.31; the Node authorizer lets a kubelet watch pods only
// with its own spec.nodeName).
func reviewAttributes(r *http.Request, info *reqinfo.Info) *authorizationv1.ResourceAttributes {
	q := r.URL.Query()
	ra := &authorizationv1.ResourceAttributes{
		Verb: "watch", Group: info.APIGroup, Version: info.APIVersion, Resource: info.Resource,
		Subresource: info.Subresource, Namespace: info.Namespace, Name: info.Name,
	}
	if s := q.Get("labelSelector"); s != "" {
		ra.LabelSelector = &authorizationv1.LabelSelectorAttributes{RawSelector: s}
	}
	if s := q.Get("fieldSelector"); s != "" {
		ra.FieldSelector = &authorizationv1.FieldSelectorAttributes{RawSelector: s}
	}
	return ra
}

func (k credKey) review(ra *authorizationv1.ResourceAttributes) reviewKey {
	h := sha256.New()
	h.Write(k[:])
	b, _ := json.Marshal(ra) // plain strings: never fails
	h.Write(b)
	var out reviewKey
	h.Sum(out[:0])
	return out
}

// review says whether the client of the watch r, with cred, may share a feed: "" when the
// apiserver allowed it, by a review that began after r arrived; else why not (a
// PrivateFeedReasons value, or reviewClientGone). It waits at most for two reviews, and not
// after r's client left.
func (h *Handler) review(r *http.Request, info *reqinfo.Info, cred upstream.Credentials, ck credKey) string {
	return h.reviewVerb(r.Context(), r, info, cred, ck, "watch")
}

// reviewVerb is review for verb on r's scope (an absorb asks for list, share_state.go),
// waiting for the answer until ctx ends.
func (h *Handler) reviewVerb(ctx context.Context, r *http.Request, info *reqinfo.Info, cred upstream.Credentials, ck credKey, verb string) string {
	ra := reviewAttributes(r, info)
	ra.Verb = verb
	key := ck.review(ra)
	rv := h.reviews
	now := h.clk.Now()
	rv.mu.Lock()
	if el := rv.denied[key]; el != nil {
		if now.Before(el.Value.(*deniedEntry).until) {
			rv.mu.Unlock()
			h.countReview(reviewCachedDeny)
			return privateDenied
		}
		rv.order.Remove(el)
		delete(rv.denied, key)
	}
	fl, send := rv.flights[key], false
	switch {
	case fl == nil: // none on the wire: this watch's is sent now
		fl = &reviewFlight{done: make(chan struct{}), req: h.reviewRequest(r, ra), cred: cred}
		rv.flights[key], send = fl, true
	default: // one on the wire began before this watch arrived: wait for the next
		if fl.next == nil {
			fl.next = &reviewFlight{done: make(chan struct{}), req: h.reviewRequest(r, ra), cred: cred}
		}
		fl = fl.next
	}
	fl.waiters++
	if send {
		h.sendFlight(key, fl)
	}
	rv.mu.Unlock()
	select {
	case <-fl.done:
	case <-ctx.Done():
		rv.leave(fl)
		return reviewClientGone // it is served nothing anyway
	}
	if !send {
		h.countReview(reviewCoalesced)
	}
	switch {
	case fl.allowed:
		return ""
	case fl.result == reviewError:
		return privateReviewFailed
	}
	return privateDenied
}

// sendFlight puts fl, the flight of key, on the wire. reviews.mu is held.
func (h *Handler) sendFlight(key reviewKey, fl *reviewFlight) {
	ctx, cancel := context.WithTimeout(context.Background(), reviewTimeout)
	fl.sent, fl.cancel = true, cancel
	go h.runReview(ctx, key, fl) // exits when the review is answered, times out or is cancelled
}

// leave is told that a watch waiting for fl stopped waiting; the last one to go cancels it
// when it is on the wire (a flight not sent yet is dropped when its turn comes).
func (rv *reviews) leave(fl *reviewFlight) {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	fl.waiters--
	if fl.waiters == 0 && fl.sent {
		fl.cancel()
	}
}

// reviewRequest is the SelfSubjectAccessReview for ra, with every header of the client's watch r
// (its credentials, its own impersonation: what the watch would go with) but the ones about the
// body and the answer's format.
func (h *Handler) reviewRequest(r *http.Request, ra *authorizationv1.ResourceAttributes) *http.Request {
	body, _ := json.Marshal(&authorizationv1.SelfSubjectAccessReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "authorization.k8s.io/v1", Kind: "SelfSubjectAccessReview"},
		Spec:     authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: ra},
	})
	out := (&http.Request{Method: http.MethodPost, URL: &url.URL{Path: reviewPath}, Header: make(http.Header, len(r.Header)+2),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}).WithContext(context.Background())
	upstream.CopyEndToEnd(out.Header, r.Header)
	for _, k := range []string{"Accept-Encoding", "Content-Length", "Content-Encoding", "If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since"} {
		out.Header.Del(k)
	}
	out.Header.Set("Accept", "application/json")
	out.Header.Set("Content-Type", "application/json")
	upstream.SetForwarded(out, r)
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.ContentLength = int64(len(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return out
}

// runReview sends fl's review (the Attempter's retries and backoff, within ctx), keeps a
// denial under key, ends fl and sends the next flight of key if a watch waits for it.
func (h *Handler) runReview(ctx context.Context, key reviewKey, fl *reviewFlight) {
	allowed, result, auditID, err := h.sendReview(ctx, fl.req, fl.cred)
	rv := h.reviews
	rv.mu.Lock()
	abandoned := fl.waiters == 0 // cancelled, or no one to tell: it counts for nothing
	fl.cancel()
	fl.allowed, fl.result = allowed, result
	if !allowed && !abandoned {
		if el := rv.denied[key]; el != nil {
			rv.order.Remove(el)
		}
		for rv.order.Len() >= rv.max {
			old := rv.order.Remove(rv.order.Front()).(*deniedEntry)
			delete(rv.denied, old.key)
		}
		rv.denied[key] = rv.order.PushBack(&deniedEntry{key: key, until: h.clk.Now().Add(reviewDeniedTTL)})
	}
	delete(rv.flights, key)
	if next := fl.next; next != nil && next.waiters > 0 {
		rv.flights[key] = next
		h.sendFlight(key, next)
	}
	rv.mu.Unlock()
	if !abandoned {
		h.countReview(result) // before done: a watch told the answer finds it counted
	}
	close(fl.done)
	if abandoned {
		return
	}
	if ce := h.log.Check(zap.DebugLevel, "access review"); ce != nil {
		fields := []zap.Field{zap.String("result", result), zap.String("reviewAuditID", auditID)}
		if err != nil {
			fields = append(fields, zap.Error(err))
		}
		ce.Write(fields...)
	}
	if result == reviewError && err != nil {
		h.log.Info("an access review for a shared feed failed; the watch goes private", zap.Error(err))
	}
}

// sendReview sends one review and reads its answer: whether it allowed, the result label, and
// the answer's Audit-Id (the apiserver's audit log names the reviewed user under it).
func (h *Handler) sendReview(ctx context.Context, req *http.Request, cred upstream.Credentials) (bool, string, string, error) {
	at, err := h.deps.Attempts.Do(ctx, req.WithContext(ctx), upstream.Plan{
		Credentials: cred, Idempotent: true, Deadline: h.clk.Now().Add(reviewTimeout)})
	if err != nil {
		return false, reviewError, "", err
	}
	defer at.Cancel(nil)
	resp := at.Resp
	defer drain(resp)
	auditID := resp.Header.Get("Audit-Id")
	switch resp.StatusCode {
	case http.StatusUnauthorized:
		return false, reviewUnauthorized, auditID, nil
	case http.StatusForbidden:
		return false, reviewForbidden, auditID, nil
	case http.StatusOK, http.StatusCreated:
	default:
		return false, reviewError, auditID, fmt.Errorf("%s answered the access review %s", at.Backend, resp.Status)
	}
	var out authorizationv1.SelfSubjectAccessReview
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out); err != nil {
		return false, reviewError, auditID, fmt.Errorf("reading the access review's answer from %s: %w", at.Backend, err)
	}
	if out.Status.Allowed && !out.Status.Denied {
		return true, reviewAllowed, auditID, nil
	}
	return false, reviewDenied, auditID, nil
}

func (h *Handler) countReview(result string) {
	h.deps.Metrics.SharedAccessReviews.WithLabelValues(result).Inc()
}

// ReviewList says whether the apiserver allows the client of the list r (classified as info,
// going with cred) to list its scope: an access review with its own credentials, begun after r
// arrived and coalesced with identical ones as a watch's are (package coalesce then lets it
// share a list with the other identities allowed it, docs/design.md section 18). False for
// credentials that are not reviewed (needsReview: the lent identity, anonymous), on any answer
// but allowed, and when the client left before the answer.
func (h *Handler) ReviewList(r *http.Request, info *reqinfo.Info, cred upstream.Credentials) bool {
	return needsReview(cred) && h.reviewVerb(r.Context(), r, info, cred, credentialsKey(r, cred), "list") == ""
}

package review

import (
	"bytes"
	"container/list"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/upstream"
)

// A client that brings its own credentials (a bearer token, a verified certificate whose
// identity watchsan asserts, or the lent identity with an impersonation of its own) joins or
// opens a shared feed only after the apiserver said, to a SelfSubjectAccessReview sent with
// those same credentials and impersonation headers through the same transport as its watch,
// that it may watch exactly that scope, selectors included (KEP-4601: the Node authorizer lets
// a kubelet watch pods only with its own spec.nodeName). Anything but status.allowed (a 401, a
// 403 on the review itself, allowed false, an error, a timeout) sends the watch to a private
// feed: the apiserver then answers the client itself, its own 401 or 403, and no byte of a
// feed reaches it.
//
// A decision about rights is never older than the apiserver's own: RBAC answers from its
// informers' current state (a RoleBinding deleted is refused at once) and token authentication
// caches for about 10 s, so no allowance is kept. Every join is reviewed by a review that
// began after the watch arrived, as ReadIndex batching reads in Raft: identical reviews (same
// credentials, same attributes) coalesce onto the one not yet sent, and a watch arriving while
// one is already on the wire waits for the next, which is sent once that one is answered. So
// at most two reviews of a key are ever outstanding, however many watches arrive. A denial
// (or a 401, 403 or error) is kept for deniedTTL, bounded in entries, oldest out: reusing
// one only sends a watch to a private feed, where the apiserver decides. A review no watch waits
// for any more (its clients reset their streams) is cancelled and counts for nothing. Keys are
// digests of the credentials and the review's attributes, never a credential in clear.

const (
	// DefaultEntries bounds the denied-review cache (--share-access-review-cache-entries).
	DefaultEntries = 10000
	// deniedTTL is the apiserver's webhook authorizer's unauthorized cache lifetime
	// (--authorization-webhook-cache-unauthorized-ttl default): a denial only ever sends a
	// watch to a private feed, where the apiserver answers it itself.
	deniedTTL = 30 * time.Second
	// timeout bounds one review, its retries included (the request budget).
	timeout = upstream.DefaultRetryBudget
)

// path is where a SelfSubjectAccessReview is created.
const path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"

// The values of watchsan_shared_feed_access_reviews_total's result label (Results): what
// decided one watch's access to a shared feed.
const (
	ResultAllowed      = "allowed"       // the apiserver's review said allowed
	ResultDenied       = "denied"        // the review said not allowed (or denied)
	ResultUnauthorized = "unauthorized"  // the review was answered 401: the credentials are no one's
	ResultForbidden    = "forbidden"     // the review was answered 403: the identity may not even ask
	ResultError        = "error"         // no answer, a timeout, or one watchsan does not read
	ResultCachedDeny   = "cached-denied" // a denial, a 401, 403 or error within deniedTTL
	ResultCoalesced    = "coalesced"     // took the answer of a review another watch's arrival sent
)

// Results lists watchsan_shared_feed_access_reviews_total's results (to initialise series).
var Results = []string{ResultAllowed, ResultDenied, ResultUnauthorized, ResultForbidden, ResultError,
	ResultCachedDeny, ResultCoalesced}

// Verdict is what a review says of one request; the zero value is Denied.
type Verdict int

const (
	// Denied: the apiserver did not allow it (a denial, a 401 or 403, or one kept).
	Denied Verdict = iota
	// Allowed: the apiserver allowed it, by a review that began after the request arrived.
	Allowed
	// Failed: the review got no answer in time, or one watchsan does not read.
	Failed
	// ClientGone: the request's client left before the answer; nothing is counted for it.
	ClientGone
)

// Attempter sends a request upstream, as upstream.Attempter.Do (whose contract it keeps:
// an Attempt with a response, or an error, never neither).
type Attempter interface {
	Do(ctx context.Context, req *http.Request, plan upstream.Plan) (upstream.Attempt, error)
}

// Cache is the reviews in flight and the recent denials. Its dependencies are set by New and
// never written again; the rest is guarded by mu.
type Cache struct {
	attempts Attempter
	clk      clock.Clock
	log      *zap.Logger
	results  *prometheus.CounterVec // watchsan_shared_feed_access_reviews_total, by result
	max      int                    // bounds denied

	mu     sync.Mutex
	denied map[key]*list.Element // of *deniedEntry
	order  *list.List            // oldest first
	// flights holds, per key, the review on the wire (sent); a watch that arrives meanwhile
	// waits for its next, which is sent once it is answered.
	flights map[key]*flight
}

type deniedEntry struct {
	key   key
	until time.Time
}

// flight is one review, sent or to be sent; done is closed once allowed and result are set.
// Its fields but done are guarded by Cache.mu.
type flight struct {
	done    chan struct{}
	req     *http.Request        // the review request (its first waiter's: every waiter's is the same)
	cred    upstream.Credentials // what it goes with
	waiters int                  // the watches waiting for it
	sent    bool                 // it is on the wire: a watch arriving now waits for next
	next    *flight              // the review the watches arriving while this one is sent wait for
	cancel  context.CancelFunc   // ends it once no watch waits (set when sent)
	allowed bool
	result  string
}

// New is a Cache of at most max denials (0: DefaultEntries) that sends reviews through
// attempts, on clk, logs to log and counts each review's result in results.
func New(max int, attempts Attempter, clk clock.Clock, log *zap.Logger, results *prometheus.CounterVec) *Cache {
	if max == 0 {
		max = DefaultEntries
	}
	return &Cache{attempts: attempts, clk: clk, log: log, results: results, max: max,
		denied: map[key]*list.Element{}, order: list.New(), flights: map[key]*flight{}}
}

// Review says whether the client of r (classified as info, going with cred, whose digest is
// ck) may verb ("watch", "list") r's scope: Allowed by a review that began after r arrived.
// It waits at most for two reviews, and not after ctx ends (ClientGone).
func (c *Cache) Review(ctx context.Context, r *http.Request, info *reqinfo.Info, cred upstream.Credentials, ck CredKey, verb string) Verdict {
	ra := Attributes(r, info)
	ra.Verb = verb
	k := ck.review(ra)
	now := c.clk.Now()
	c.mu.Lock()
	if el := c.denied[k]; el != nil {
		if now.Before(el.Value.(*deniedEntry).until) {
			c.mu.Unlock()
			c.count(ResultCachedDeny)
			return Denied
		}
		c.order.Remove(el)
		delete(c.denied, k)
	}
	fl, send := c.flights[k], false
	switch {
	case fl == nil: // none on the wire: this watch's is sent now
		fl = &flight{done: make(chan struct{}), req: request(r, ra), cred: cred}
		c.flights[k], send = fl, true
	default: // one on the wire began before this watch arrived: wait for the next
		if fl.next == nil {
			fl.next = &flight{done: make(chan struct{}), req: request(r, ra), cred: cred}
		}
		fl = fl.next
	}
	fl.waiters++
	if send {
		c.send(k, fl)
	}
	c.mu.Unlock()
	select {
	case <-fl.done:
	case <-ctx.Done():
		c.leave(fl)
		return ClientGone // it is served nothing anyway
	}
	if !send {
		c.count(ResultCoalesced)
	}
	switch {
	case fl.allowed:
		return Allowed
	case fl.result == ResultError:
		return Failed
	}
	return Denied
}

// Size is what the cache holds at one instant (Cache.Size).
type Size struct {
	Flights int // keys with a review on the wire
	Sent    int // requests waiting for a review on the wire
	Next    int // requests waiting for the review after one on the wire
	Denied  int // denials kept
}

// Size is what the cache holds now (tests).
func (c *Cache) Size() Size {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Size{Flights: len(c.flights), Denied: c.order.Len()}
	for _, fl := range c.flights {
		if fl.sent {
			s.Sent += fl.waiters
		}
		if fl.next != nil {
			s.Next += fl.next.waiters
		}
	}
	return s
}

// send puts fl, the flight of k, on the wire. mu is held.
func (c *Cache) send(k key, fl *flight) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	fl.sent, fl.cancel = true, cancel
	go c.run(ctx, k, fl) // exits when the review is answered, times out or is cancelled
}

// leave is told that a watch waiting for fl stopped waiting; the last one to go cancels it
// when it is on the wire (a flight not sent yet is dropped when its turn comes).
func (c *Cache) leave(fl *flight) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fl.waiters--
	if fl.waiters == 0 && fl.sent {
		fl.cancel()
	}
}

// request is the SelfSubjectAccessReview for ra, with every header of the client's watch r
// (its credentials, its own impersonation: what the watch would go with) but the ones about the
// body and the answer's format.
func request(r *http.Request, ra *authorizationv1.ResourceAttributes) *http.Request {
	body, _ := json.Marshal(&authorizationv1.SelfSubjectAccessReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "authorization.k8s.io/v1", Kind: "SelfSubjectAccessReview"},
		Spec:     authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: ra},
	})
	out := (&http.Request{Method: http.MethodPost, URL: &url.URL{Path: path}, Header: make(http.Header, len(r.Header)+2),
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

// run sends fl's review (the Attempter's retries and backoff, within ctx), keeps a denial
// under k, ends fl and sends the next flight of k if a watch waits for it.
func (c *Cache) run(ctx context.Context, k key, fl *flight) {
	allowed, result, auditID, err := c.ask(ctx, fl.req, fl.cred)
	c.mu.Lock()
	abandoned := fl.waiters == 0 // cancelled, or no one to tell: it counts for nothing
	fl.cancel()
	fl.allowed, fl.result = allowed, result
	if !allowed && !abandoned {
		if el := c.denied[k]; el != nil {
			c.order.Remove(el)
		}
		for c.order.Len() >= c.max {
			old := c.order.Remove(c.order.Front()).(*deniedEntry)
			delete(c.denied, old.key)
		}
		c.denied[k] = c.order.PushBack(&deniedEntry{key: k, until: c.clk.Now().Add(deniedTTL)})
	}
	delete(c.flights, k)
	if next := fl.next; next != nil && next.waiters > 0 {
		c.flights[k] = next
		c.send(k, next)
	}
	c.mu.Unlock()
	if !abandoned {
		c.count(result) // before done: a watch told the answer finds it counted
	}
	close(fl.done)
	if abandoned {
		return
	}
	if ce := c.log.Check(zap.DebugLevel, "access review"); ce != nil {
		fields := []zap.Field{zap.String("result", result), zap.String("reviewAuditID", auditID)}
		if err != nil {
			fields = append(fields, zap.Error(err))
		}
		ce.Write(fields...)
	}
	if result == ResultError && err != nil {
		c.log.Info("an access review for a shared feed failed; the watch goes private", zap.Error(err))
	}
}

// ask sends one review and reads its answer: whether it allowed, the result label, and the
// answer's Audit-Id (the apiserver's audit log names the reviewed user under it).
func (c *Cache) ask(ctx context.Context, req *http.Request, cred upstream.Credentials) (bool, string, string, error) {
	at, err := c.attempts.Do(ctx, req.WithContext(ctx), upstream.Plan{
		Credentials: cred, Idempotent: true, Deadline: c.clk.Now().Add(timeout)})
	if err != nil {
		return false, ResultError, "", err
	}
	defer at.Cancel(nil)
	resp := at.Resp
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
	}()
	auditID := resp.Header.Get("Audit-Id")
	switch resp.StatusCode {
	case http.StatusUnauthorized:
		return false, ResultUnauthorized, auditID, nil
	case http.StatusForbidden:
		return false, ResultForbidden, auditID, nil
	case http.StatusOK, http.StatusCreated:
	default:
		return false, ResultError, auditID, fmt.Errorf("%s answered the access review %s", at.Backend, resp.Status)
	}
	var out authorizationv1.SelfSubjectAccessReview
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out); err != nil {
		return false, ResultError, auditID, fmt.Errorf("reading the access review's answer from %s: %w", at.Backend, err)
	}
	if out.Status.Allowed && !out.Status.Denied {
		return true, ResultAllowed, auditID, nil
	}
	return false, ResultDenied, auditID, nil
}

func (c *Cache) count(result string) {
	c.results.WithLabelValues(result).Inc()
}

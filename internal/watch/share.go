package watch

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/watchsan/watchsan/internal/absorb"
	"github.com/watchsan/watchsan/internal/budget"
	"github.com/watchsan/watchsan/internal/chunked"
	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/queue"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/review"
	"github.com/watchsan/watchsan/internal/ring"
	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/upstream"
)

// Shared feeds (docs/design.md section 11). With Config.Share, a client watch
// that is the same watch as an open shared feed, and whose resourceVersion the feed's ring
// covers, is served by that feed: one upstream watch for all its subscribers. The feed is a
// feed (feed.go) like a private one, its sink a sharedFeed instead of a subscriber: the fix
// policy, the delete memory's scope, the resume point, the watchdog and every resume are the
// feed's, once for all its subscribers. It renders each event once into the frame a subscriber
// is sent, keeps the object events in a bounded ring, and appends each frame to every
// subscriber's queue (member) without ever waiting for one: a member whose queue is full is
// ended (EndSlowClient), as the apiserver ends a watcher that cannot keep up, and its client
// re-watches from its last resourceVersion. Each member writes its queue out with its own
// bookmarks and its own timeoutSeconds: on HTTP/1.1 from its own connection, its handler
// returned (detach.go), else from its client's request goroutine.
//
// Sharing is only where the identity question has an answer: a client that gets the lent
// identity shares with the others that get it, and a client with credentials of its own (a
// token, an asserted certificate) shares only once the apiserver said that it may watch that
// scope (package review). Everything else gets a private feed, counted by reason.

// Defaults of the sharing bounds, the flags' defaults.
const (
	// DefaultShareRingBytes and DefaultShareRingEvents bound a shared feed's ring of recent
	// events: what a client re-watching from a recent resourceVersion can join from.
	DefaultShareRingBytes  = 16 << 20
	DefaultShareRingEvents = 10000
	// DefaultShareRingTotalBytes bounds all feeds' rings together where the container's
	// memory limit says nothing (config derives the flag's default from it, a quarter of it,
	// when there is one): half the memory budget's default there (budget.DefaultBytes), two
	// full rings; an audit's 20 feeds split by an unknown parameter held 268 MB of rings
	// under the 256 MiB this was, past any bound a process without a limit should assume.
	DefaultShareRingTotalBytes = 32 << 20
	// DefaultShareSubscriberBytes bounds what one subscriber may be behind its feed; it can
	// take a whole ring's backlog at its join.
	DefaultShareSubscriberBytes = 16 << 20
	// DefaultShareGrace is how long a shared feed outlives its last subscriber: a client that
	// re-watches at once (its timeoutSeconds, a slow subscriber ended) finds it still open.
	DefaultShareGrace = 5 * time.Second
	// DefaultShareMaxFeeds bounds the open shared feeds: the registry, and the feeds kept for
	// ShareGrace after their last client left (a client opening distinct watches in a loop).
	// Far above the distinct watches a node's clients hold (a kubelet watches each secret and
	// configmap its pods use by name, some hundreds for 110 pods; daemon sets a few each), so
	// it does not bind in normal use; each feed is a goroutine and its ring, which holds only
	// its own scope's recent events (at most --share-ring-bytes).
	DefaultShareMaxFeeds = 10000
)

// The values of watchsan_watch_private_feeds_total's reason label: why a client watch got a
// private feed with sharing on (PrivateFeedReasons).
const (
	// privateIdentity: the client is anonymous (or went as sent, undecided): no review can say
	// what the apiserver would answer its watch, so it watches on its own.
	privateIdentity = "identity"
	// privateDenied: its own credentials were refused by the apiserver's access review (a 401,
	// a 403, not allowed): its watch goes to the apiserver, which answers it itself.
	privateDenied = "access-denied"
	// privateReviewFailed: the access review got no answer in time (or one watchsan does not
	// read), or the client left while it waited.
	privateReviewFailed = "access-review-failed"
	// privateInitial: resourceVersion "" or "0": it starts with the current state.
	privateInitial = "initial-state"
	// privateWatchList: sendInitialEvents or resourceVersionMatch: a watch-list.
	privateWatchList = "watch-list"
	// privateRV: a resourceVersion that is no integer, or a timeoutSeconds already over.
	privateRV = "resource-version"
	// privateNotCovered: the same watch's feed is open, but its ring does not cover the
	// resourceVersion (older than the ring, or newer than the feed got).
	privateNotCovered = "not-covered"
	// privateBacklog: the events after the resourceVersion are more than a subscriber's bound.
	privateBacklog = "backlog"
	// privateNotJoinable: the feed delivered a resourceVersion that is no integer or not
	// above the one before (observe mode passes regressions): "the events after N" is no
	// longer one slice of its ring.
	privateNotJoinable = "not-joinable"
	// privateFeedFailed: the feed's first attempt was not a stream (an error status, a format
	// watchsan does not parse): every client asks on its own and gets its own answer.
	privateFeedFailed = "feed-failed"
	// privateExcluded: the resource is one --share-exclude-resource names.
	privateExcluded = "excluded"
	// privateFeedLimit: no feed of this watch is open, and --share-max-feeds are.
	privateFeedLimit = "feed-limit"
)

// PrivateFeedReasons lists watchsan_watch_private_feeds_total's reasons (to initialise series).
var PrivateFeedReasons = []string{privateIdentity, privateDenied, privateReviewFailed, privateInitial, privateWatchList, privateRV,
	privateNotCovered, privateBacklog, privateNotJoinable, privateFeedFailed, privateExcluded, privateFeedLimit}

// shareRule is the one rule for which watches may be served by a shared feed: "" when it may
// (it still needs a feed whose ring covers its resourceVersion), else why not, a
// PrivateFeedReasons value. The lent identity shares: every client that gets it is the same
// user to the apiserver, which the lending guard decided it may be. A client's own credentials
// may share once an access review allowed them (review.NeedsReview; serveShared asks only for a watch
// this rule lets share, so a review is spent only where it can matter).
func shareRule(cred upstream.Credentials, p params) string {
	if !lentPlain(cred) && !review.NeedsReview(cred) {
		return privateIdentity
	}
	switch {
	case p.watchList():
		return privateWatchList
	case p.rv == "" || p.rv == "0":
		return privateInitial
	case p.timeout < 0, !p.rvIsInt:
		return privateRV
	}
	return ""
}

// perSubscriber are the query parameters that are each subscriber's own and not in a feed's
// key: its resourceVersion (where it joins the ring), its timeoutSeconds (the feed outlives
// it), allowWatchBookmarks (the feed always asks for bookmarks, and passes them only to the
// subscribers that did) and timeout, which client-go's typed clients send with every watch
// (its timeoutSeconds as a duration, random per re-watch) and the apiserver ignores on a watch
// (ListResource in endpoints/handlers/get.go: "we explicitly ignore ?timeout= and use only
// ?timeoutSeconds="). Every other parameter, known or not, is in the key: two watches share a
// feed only if the apiserver was asked exactly the same (docs/design.md section 11).
var perSubscriber = []string{"resourceVersion", "timeoutSeconds", "allowWatchBookmarks", "timeout"}

// feedKey is what makes two watches the same upstream watch: the path (resource, namespace,
// name; one Handler has one set of upstreams), every query parameter but perSubscriber's
// (selectors, watch-list options, anything else), the Accept header (the wire format the
// apiserver answers in) and who it goes as (feedPrincipal). query is r's, as parsed
// (params.query).
func feedKey(r *http.Request, query url.Values, cred upstream.Credentials, local bool) string {
	q := copyQuery(query)
	for _, k := range perSubscriber {
		q.Del(k)
	}
	return r.URL.Path + "?" + q.Encode() + "\x00accept=" + r.Header.Get("Accept") + "\x00as=" + feedPrincipal(cred, local)
}

// feedPrincipal is who a shared feed's subscribers are, in its key (docs/design.md section 11,
// "Who shares with whom"):
//   - "lent" for the lent identity without an impersonation of its own (lentPlain): one
//     identity, which the lending guard decided the client may use;
//   - "reviewed" for every other client an access review allowed to watch the scope, whoever
//     it is, when the apiserver serves the resource itself (local): it sends every identity
//     allowed to watch a scope the same events, and the feed goes with its opener's
//     credentials;
//   - the client's own principal otherwise (an aggregated API, which receives the user and may
//     answer each one differently; or one watchsan cannot classify): such a feed's
//     subscribers are all the same identity to the apiserver, and still each reviewed at its
//     join, since its rights may have changed since the feed opened.
//
// "lent" and "reviewed" never share: a lent client was never reviewed, and the lent identity
// may not be allowed what a reviewed client is.
func feedPrincipal(cred upstream.Credentials, local bool) string {
	switch {
	case lentPlain(cred):
		return "lent"
	case local:
		return "reviewed"
	}
	return "only:" + cred.Principal()
}

// lentPlain says whether cred is the lent identity itself: lent, impersonating no one.
func lentPlain(cred upstream.Credentials) bool { return cred.Lent() && !cred.Impersonates() }

// servedLocally says whether the apiserver serves info's group-version itself (Deps.ServedLocally).
func (h *Handler) servedLocally(info *reqinfo.Info) bool {
	return h.deps.ServedLocally != nil && h.deps.ServedLocally(info.APIGroup, info.APIVersion)
}

// registry holds the open shared feeds by feedKey. Its lock is taken before a feed's.
type registry struct {
	mu    sync.Mutex
	feeds map[string]*sharedFeed
	// exclude holds Config.ShareExclude's resources: their watches never share. Set at
	// construction.
	exclude map[string]bool
	// rings is the budget all feeds' rings share (--share-ring-total-bytes); with its
	// bounds of one ring (ringBytes, ringEvents) and its evictions' counter, what newRing
	// makes each ring with. Set at construction.
	rings                 *ring.Budget
	ringBytes, ringEvents int
	evictions             *prometheus.CounterVec
}

// newRegistry makes the registry of a Handler's shared feeds, with the bounds of cfg (its
// defaults applied) and the rings' metrics and memory budget of d.
func newRegistry(cfg Config, d Deps) *registry {
	g := &registry{feeds: map[string]*sharedFeed{}, exclude: map[string]bool{},
		rings:     ring.NewBudget(cfg.ShareRingTotalBytes, d.Metrics.SharedRingBytes, d.Budget),
		ringBytes: cfg.ShareRingBytes, ringEvents: cfg.ShareRingEvents, evictions: d.Metrics.SharedRingEvictions}
	for _, r := range cfg.ShareExclude {
		g.exclude[r] = true
	}
	return g
}

// newRing makes a feed's ring, covering from start, in the budget.
func (g *registry) newRing(start uint64) *ring.Ring {
	return ring.New(start, g.ringBytes, g.ringEvents, g.rings, g.evictions)
}

// serveShared serves the watch r on a shared feed when it may be (shareRule) and one covers
// it, or opens one; false when it gets a private feed (counted by reason), which the caller
// serves as without sharing. A watch-list that may hand off onto a shared feed once it has its
// initial events (handoff.go) gets a private feed too, and its handoff, counted there.
func (h *Handler) serveShared(w http.ResponseWriter, r *http.Request, info *reqinfo.Info, cred upstream.Credentials, p params, requestID string) (bool, *handoff) {
	reason := privateExcluded // the operator's word first: no other rule is asked
	if !h.feeds.exclude[info.GroupResource()] {
		reason = shareRule(cred, p)
	}
	// A watch-list hands off onto a feed with the lent identity itself, or with credentials
	// of its own once reviewed at its bookmark when Config.ShareReviewedWatchLists (handoff.go);
	// the lent identity impersonating keeps its watch-list private.
	if reason == privateWatchList && (lentPlain(cred) || h.cfg.ShareReviewedWatchLists && review.NeedsReview(cred)) {
		if ho := handoffFor(r, info, cred, p); ho != nil {
			return false, ho
		}
	}
	var ck *review.CredKey // the client's credentials' digest when they were reviewed
	if reason == "" && review.NeedsReview(cred) {
		k := review.CredentialsKey(r, cred)
		ck = &k
		if reason = h.review(r, info, cred, k); reason == reviewClientGone {
			return true, nil // its client left (a reset stream): nothing to serve, no feed opened
		}
	}
	if reason == "" {
		var (
			sf *sharedFeed
			m  *member
		)
		sf, m, reason = h.join(r, info, cred, ck, p)
		if reason == "" {
			select {
			case <-sf.ready:
			case <-r.Context().Done():
				sf.leave(m)
				return true, nil
			}
			if sf.ok {
				sf.serve(w, r, m, p, requestID)
				return true, nil
			}
			reason = privateFeedFailed
		}
	}
	h.deps.Metrics.PrivateFeeds.WithLabelValues(reason).Inc()
	return false, nil
}

// join finds the feed of r's key and joins it at p's resourceVersion, or opens the feed with
// r's request as its template. Else it says why not.
func (h *Handler) join(r *http.Request, info *reqinfo.Info, cred upstream.Credentials, ck *review.CredKey, p params) (*sharedFeed, *member, string) {
	at := p.rvInt
	key := feedKey(r, p.query, cred, !lentPlain(cred) && h.servedLocally(info)) // the lent identity's feeds ask no one
	// What its review was made with, for an absorb's list review (share_state.go).
	var acc *memberAccess
	if ck != nil {
		acc = newMemberAccess(r, info, cred, *ck)
	}
	g := h.feeds
	g.mu.Lock()
	defer g.mu.Unlock()
	sf := g.feeds[key]
	var (
		m      *member
		reason string
	)
	switch {
	case sf != nil:
		if m, reason = sf.add(at, p.allowBookmarks, acc); reason == "" {
			h.deps.Metrics.SharedJoins.Inc()
		}
	case len(g.feeds) >= h.cfg.ShareMaxFeeds:
		return nil, nil, privateFeedLimit
	default:
		sf, m = h.openFeed(key, r, p, info, cred, acc, nil, "")
	}
	return sf, m, reason
}

// openFeed opens the feed for key from p's resourceVersion, r (its parameters p) its template,
// with a first member there; the registry's lock is held, and the caller has checked --share-max-feeds. acc
// is what the first member's access review was made with (package review), nil for the lent
// identity: the feed is then a reviewed one. st is the
// state a handoff moves onto it, complete at rv (nil: none, why says why; both zero: it
// adopts the one parked at its resourceVersion, share_state.go).
func (h *Handler) openFeed(key string, r *http.Request, p params, info *reqinfo.Info, cred upstream.Credentials, acc *memberAccess, st *absorb.State, why string) (*sharedFeed, *member) {
	sf := h.newSharedFeed(key, r, p, info, cred)
	sf.reviewed = acc != nil
	h.sharedState(sf, sf.f.client, cred, p.rv, st, why)
	h.feeds.feeds[key] = sf
	m, _ := sf.add(p.rvInt, p.allowBookmarks, acc)
	sf.opener = m
	h.deps.Metrics.SharedFeeds.Inc()
	go sf.run() // exits when the feed ends: its last subscriber gone, shutdown, or its upstream's end
	return sf, m
}

// sharedFeed is a shared feed's sink (feed.go's contract): its policy, its ring, its members.
// The feed's goroutine calls its sink methods; joins and leaves come from the members' request
// goroutines, under mu.
//
// One writer per field: each field is written in this file (at construction, newSharedFeed,
// or by the methods here), except those whose owner is named beside them; other files ask
// the owner (deliver, restartRing).
type sharedFeed struct {
	h   *Handler
	key string
	f   *feed
	log *watchLog
	// pol is the feed's policy (policy.go), once for all its subscribers; it answers no client.
	pol policy
	// policy is what pol's stream is made with once the format is known.
	policy fix.Options
	from   uint64
	// reviewed: its subscribers were admitted by access reviews (package review); false for the
	// lent identity's feeds.
	reviewed bool

	// ready is closed once the first attempt answered: ok, header and format are set then.
	ready  chan struct{}
	ok     bool
	header http.Header // what every subscriber's response carries (feedHeaders of the first answer's)
	// opener is the member whose watch opened the feed, and openerHeader the first answer's
	// headers whole: its request's own (Audit-Id, the APF headers), which only it gets.
	opener       *member
	openerHeader http.Header
	writer       *stream.Writer // renders each event's frame into frame
	frame        frameCapture
	dirty        bool // a member got a frame since the last flush (the feed's goroutine's; deliver, flush)

	// idle: the grace after the last subscriber left ran out; the feed ends (gone).
	idle atomic.Bool
	// What /debug/feeds lists (feeds_debug.go): desc from the start, snap published by the
	// feed's goroutine (publish), nsubs kept with members; never the key.
	desc  feedDesc
	snap  atomic.Pointer[feedSnapshot] // written in feeds_debug.go (publish)
	nsubs atomic.Int32

	mu      sync.Mutex
	members map[*member]struct{}
	// ring holds the recent object events joiners are served from (newSharedFeed; started
	// over by restartRing at an absorb's end, released by close).
	ring *ring.Ring
	// last is the newest resourceVersion delivered (object events and bookmarks): advance, and
	// restartRing at an absorb's end.
	last uint64
	// notJoinable, when set, is why no one may join any more (privateNotJoinable).
	notJoinable string
	// rewrote: the policy rewrote a delivered resourceVersion; no watch-list hands off onto
	// the feed (handoff.go).
	rewrote bool
	// absorbing: an absorb's events are being delivered: no one joins, no waiting handoff is
	// woken, until it ends. Written in share_state.go (absorbBegin, absorbEnd).
	absorbing bool
	closed    bool
	idleTimer clock.Timer
	// waiters are handoffs waiting for the feed to deliver a resourceVersion. Written in
	// handoff.go.
	waiters []rvWaiter
	// opened is when the feed was made: one whose members all leave before it is
	// Config.ShareGrace old ends at once (drop), not after the grace.
	opened time.Time
}

// newSharedFeed makes the feed for key, opened by the watch r (its parameters p) from its
// resourceVersion, with its own context: it outlives r. Its upstream request is r's without
// timeoutSeconds.
func (h *Handler) newSharedFeed(key string, r *http.Request, p params, info *reqinfo.Info, cred upstream.Credentials) *sharedFeed {
	rv, at, scope := p.rv, p.rvInt, p.scope
	tmpl := r.Clone(context.Background())
	q := copyQuery(p.query)
	q.Del("timeoutSeconds")
	q.Del("timeout") // the first client's, ignored on a watch (perSubscriber)
	raw := q.Encode()
	tmpl.URL = &url.URL{Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: raw}
	ctx, cancel := context.WithCancelCause(context.Background())
	log := newWatchLog(h.log.Named("feed").With(zap.String("feed", r.URL.Path+"?"+raw)), r.RemoteAddr, "")
	sf := &sharedFeed{h: h, key: key, log: log, from: at, ready: make(chan struct{}), members: map[*member]struct{}{}, last: at,
		desc: h.describe(q, r.Header.Get("Accept"), info), opened: h.clk.Now()}
	sf.ring = h.feeds.newRing(at)
	mode := h.cfg.Mode
	if h.exempt[info.GroupResource()] {
		mode = fix.PassAll
	}
	// The delete memory's scope is the opener's principal, whom the feed goes as upstream (for a
	// reviewed feed not "reviewed": one reviewed client's remembered deletes must not suppress
	// a delete another one's own feed replays to it).
	sf.policy = fix.Options{Scope: scopeOf(scope, cred), StartRV: rv, Mode: mode, Memory: h.deps.Memory}
	// Its decisions are counted as a private watch's.
	sf.pol = newPolicy(h, tmpl.URL.Path, h.deps.Metrics.Resource(info.FullResource()), log)
	sf.f = &feed{
		h: h, client: tmpl, query: q, ctx: ctx, cancel: cancel, cred: cred, log: log, sub: sf,
		backoff: upstream.ResumeBackoff, scope: scope, groupResource: info.GroupResource(),
		// The feed's frames are every subscriber's: refused only at the total, never asked to
		// end for holding more than one client's share (its subscribers' queues are theirs).
		mem: h.deps.Budget.OpenCommon(),
	}
	if h.deps.Done != nil {
		h.track(sf.f)
	}
	return sf
}

// run sends the feed's first attempt and receives until the feed ends, then ends its members.
func (sf *sharedFeed) run() {
	f := sf.f
	defer f.release()
	defer sf.parkState() // before release; a no-op once parked below
	first, err := sf.h.deps.Attempts.Do(f.ctx, f.requestFrom(true, ""), f.plan(sf.from))
	if err != nil {
		sf.log.Info("shared feed's first attempt failed; its subscribers watch on their own", zap.Error(err))
		sf.close(endNone)
		return
	}
	format, ok := f.firstAnswer(first)
	if !ok {
		sf.log.Info("shared feed's first answer is no stream watchsan reads; its subscribers watch on their own",
			zap.Int("code", first.Resp.StatusCode), zap.String("contentType", first.Resp.Header.Get("Content-Type")))
		drain(first.Resp)
		first.Cancel(nil)
		sf.close(endNone)
		return
	}
	sf.stateFormat()
	sf.pol.begin(fix.NewStream(sf.policy))
	sf.writer = stream.NewWriter(format, &sf.frame)
	sf.openerHeader = first.Resp.Header.Clone()
	sf.header = feedHeaders(first.Resp.Header)
	sf.ok = true
	sf.publish()
	close(sf.ready)
	// The opener's credentials expired or were revoked (a 401 or 403 to a resume), or the
	// scope is gone: the run ends with EndResumeRefused, every subscriber's stream ends
	// cleanly, and each re-watches with its own, reviewed again.
	end := f.run(f.source(first))
	sf.log.Debug("shared feed ended", zap.Stringer("reason", end), zap.Uint64("events", f.events), zap.Int("resumes", f.resumes))
	sf.pol.logEnd(end)
	sf.parkState() // before the members end: their re-watches may open a feed that adopts it
	sf.close(end)
}

// close ends the feed: out of the registry, every member ended with end (endNone: before the
// feed started; its members watch privately).
func (sf *sharedFeed) close(end EndReason) {
	g := sf.h.feeds
	g.mu.Lock()
	sf.mu.Lock()
	if g.feeds[sf.key] == sf {
		delete(g.feeds, sf.key)
		sf.h.deps.Metrics.SharedFeeds.Dec()
	}
	sf.closed = true
	if sf.idleTimer != nil {
		sf.idleTimer.Stop()
	}
	sf.ring.Release() // no one joins any more: its bytes go back to the budget
	sf.wakeWaiters(true)
	members := sf.members
	sf.members = map[*member]struct{}{}
	sf.h.deps.Metrics.SharedSubscribers.Sub(float64(len(members)))
	sf.nsubs.Store(0)
	sf.mu.Unlock()
	g.mu.Unlock()
	select {
	case <-sf.ready:
	default:
		close(sf.ready) // not ok: the members waiting on it go private
	}
	for m := range members {
		m.finish(end)
		m.mem.Close()
	}
}

// add makes a member at resourceVersion at, with the ring's events after it queued, or says
// why it may not join. The registry's lock is held.
func (sf *sharedFeed) add(at uint64, bookmarks bool, acc *memberAccess) (*member, string) {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	return sf.addLocked(at, bookmarks, acc)
}

// addLocked is add with mu held.
//
// acc is what the member's access review was made with (nil: the lent identity's), given at
// its making, so no absorb (absorbAdmit) ever sees a reviewed feed's member without it.
func (sf *sharedFeed) addLocked(at uint64, bookmarks bool, acc *memberAccess) (*member, string) {
	switch {
	case sf.closed:
		return nil, privateNotCovered
	case sf.notJoinable != "":
		return nil, sf.notJoinable
	case sf.absorbing || at > sf.last:
		return nil, privateNotCovered
	}
	// The coverage and the backlog at once: the budget may evict from the ring for another
	// feed at any time (ring.Budget).
	backlog, n, ok := sf.ring.After(at)
	if !ok {
		return nil, privateNotCovered
	}
	m := &member{bookmarks: bookmarks, max: sf.h.cfg.ShareSubscriberBytes, wake: make(chan struct{}, 1), access: acc}
	if len(backlog) > 0 {
		if n += len(backlog) * queue.EntryCost; n > m.max {
			return nil, privateBacklog
		}
		// Counted, never refused: a refused backlog would make the watch a private feed, an
		// upstream watch of its own, when memory is short. Past the high mark the member may
		// be asked to end (overBudget); its client re-watches, still costing no upstream watch.
		m.mem = sf.h.deps.Budget.OpenEnding(m.overBudget)
		m.mem.Force(budget.Queues, int64(len(backlog)*queue.EntryCost))
		for _, raw := range backlog {
			m.q.Push(raw)
		}
		m.bytes, m.signal = n, true
		m.since.Store(sf.h.clk.Now().UnixNano())
		m.account()
		m.wake <- struct{}{}
	} else {
		m.mem = sf.h.deps.Budget.OpenEnding(m.overBudget)
	}
	sf.members[m] = struct{}{}
	if sf.idleTimer != nil {
		sf.idleTimer.Stop()
		sf.idleTimer = nil
	}
	sf.h.deps.Metrics.SharedSubscribers.Inc()
	sf.nsubs.Add(1)
	return m, ""
}

// leave takes m off the feed; the last to leave starts the grace after which the feed ends.
func (sf *sharedFeed) leave(m *member) {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	sf.drop(m)
}

// drop is leave with mu held.
func (sf *sharedFeed) drop(m *member) {
	if _, ok := sf.members[m]; !ok {
		return
	}
	delete(sf.members, m)
	m.mem.Close()
	sf.h.deps.Metrics.SharedSubscribers.Dec()
	sf.nsubs.Add(-1)
	if len(sf.members) == 0 && !sf.closed && sf.idleTimer == nil {
		// The grace keeps a feed for its clients' re-watches (a watch's timeout, a move).
		// A feed whose clients all left while it was younger than the grace was opened by
		// watches that did not stay - reset streams, a client gone at once - and waits for no
		// one: kept, each such watch would cost an upstream watch outliving it by the grace.
		grace := sf.h.cfg.ShareGrace
		if sf.h.clk.Since(sf.opened) < grace {
			grace = 0
		}
		sf.idleTimer = sf.h.clk.AfterFunc(grace, sf.idleEnd)
	}
}

// idleEnd ends the feed if no one joined during the grace: it leaves the registry at once (a
// watch from now on opens a new one) and its context is cancelled, which ends its attempt.
func (sf *sharedFeed) idleEnd() {
	g := sf.h.feeds
	g.mu.Lock()
	sf.mu.Lock()
	idle := len(sf.members) == 0 && !sf.closed
	if idle {
		sf.closed = true
		if g.feeds[sf.key] == sf {
			delete(g.feeds, sf.key)
			sf.h.deps.Metrics.SharedFeeds.Dec()
		}
	}
	sf.mu.Unlock()
	g.mu.Unlock()
	if idle {
		sf.idle.Store(true)
		sf.f.cancel(errNoSubscribers)
	}
}

// errNoSubscribers ends a shared feed whose last subscriber left and none joined in the grace.
var errNoSubscribers = errors.New("the shared feed's last subscriber left")

// The resume point, the policy's (sink).
func (sf *sharedFeed) InInitialPhase() bool  { return sf.pol.InInitialPhase() }
func (sf *sharedFeed) LastDelivered() string { return sf.pol.LastDelivered() }
func (sf *sharedFeed) HasResumePoint() bool  { return sf.pol.HasResumePoint() }

// decide applies the feed's policy to one event, once for every member (sink).
func (sf *sharedFeed) decide(ev *stream.Event) fix.Decision { return sf.pol.decide(ev) }

// decideGone is decide for a delete an absorb synthesized (sink): a shared feed with a state
// absorbs (share_state.go), and write keeps its ring sound across it.
func (sf *sharedFeed) decideGone(ev *stream.Event) fix.Decision { return sf.pol.decideGone(ev) }

// write renders the event into the frame each member is sent, keeps an object event in the
// ring and appends the frame to every member's queue (a bookmark only to those that asked for
// them); a member whose queue is full is ended. It never waits for a member (sink).
func (sf *sharedFeed) write(ev *stream.Event, d fix.Decision) error {
	var err error
	if d.Action == fix.Rewrite {
		err = sf.writer.WriteWithRV(ev, d.RV)
	} else {
		err = sf.writer.Write(ev)
	}
	if err != nil {
		sf.log.Warn("could not render an event for the shared feed's subscribers; skipped", zap.String("type", ev.Type), zap.Error(err))
		return nil
	}
	raw := sf.frame.take()
	rv, isInt := ev.RVInt, ev.RVIsInt
	if d.Action == fix.Rewrite {
		rv, isInt = d.RVInt, true
	}
	sf.mu.Lock()
	defer sf.mu.Unlock()
	switch {
	case ev.Type == stream.Error:
		rv = 0
	case d.Reason == fix.ReasonAbsorbedDelete && sf.absorbing:
		// A delete at the last delivered resourceVersion, of an unknown true one: to every
		// member, never to the ring, which starts over at the absorb's end (share_state.go).
		sf.fanOutGone(ev, raw, rv)
		return nil
	case d.Reason == fix.ReasonAbsorbedDelete:
		// Outside an absorb's bounds (none calls it so): the ring cannot say which joiners
		// have it, so no one joins any more.
		if sf.notJoinable == "" {
			sf.notJoinable = privateNotJoinable
			sf.wakeWaiters(true)
		}
		rv = 0
	case ev.Type == stream.Bookmark:
		sf.advance(rv, isInt, false)
	default:
		if sf.advance(rv, isInt, true) && !sf.absorbing {
			sf.ring.Add(rv, raw)
		}
	}
	if !isInt {
		rv = 0
	}
	if d.Action == fix.Rewrite {
		sf.rewrote = true
	}
	sf.fanOut(raw, ev.Type == stream.Bookmark, rv, d.Action == fix.Rewrite)
	return nil
}

// advance moves the feed's newest resourceVersion to rv, and reports whether rv is above the
// one before (an object event's must be, for the ring to be one slice of "the events after
// N"; a bookmark's may equal it). Otherwise no one may join any more. mu is held.
func (sf *sharedFeed) advance(rv uint64, isInt, event bool) bool {
	if !isInt || rv < sf.last || (event && rv == sf.last) {
		if sf.notJoinable == "" {
			sf.notJoinable = privateNotJoinable
			sf.log.Info("the shared feed delivered a resourceVersion out of order or no integer; no one joins it any more",
				zap.Uint64("rv", rv), zap.Uint64("last", sf.last))
			sf.wakeWaiters(true)
		}
		return false
	}
	sf.last = rv
	if len(sf.waiters) > 0 && !sf.absorbing {
		sf.wakeWaiters(false)
	}
	return true
}

// fanOut appends raw, delivered at resourceVersion rv (0: none, an ERROR or no integer), to
// every member's queue (a bookmark: those that asked for them), but those a handoff joined
// ahead of the feed skip what their initial events already hold (member.skip). mu is held.
func (sf *sharedFeed) fanOut(raw []byte, bookmark bool, rv uint64, rewritten bool) {
	now := sf.h.clk.Now()
	for m := range sf.members {
		if bookmark && !m.bookmarks {
			continue
		}
		if m.skip != 0 && sf.skips(m, rv, rewritten) {
			continue
		}
		sf.deliver(m, raw, now)
	}
}

// deliver appends raw to m's queue at now, for the next flush to wake it; a member whose queue
// is full is dropped (counted as it ends, serve). mu is held.
func (sf *sharedFeed) deliver(m *member, raw []byte, now time.Time) {
	if !m.push(raw, now) {
		sf.drop(m)
		return
	}
	sf.dirty = true
}

// restartRing starts the ring over at L, the newest resourceVersion delivered from then on at
// least L: an absorb's end (absorbEnd, share_state.go). mu is held.
func (sf *sharedFeed) restartRing(L uint64) {
	sf.ring.Release()
	sf.ring = sf.h.feeds.newRing(L)
	sf.last = max(sf.last, L)
}

// flush wakes the members that got frames since the last flush; the feed calls it before it
// may wait for its upstream, so a member's events never wait with it (sink).
func (sf *sharedFeed) flush() error {
	sf.publish() // what /debug/feeds lists, as of this read
	if !sf.dirty {
		return nil
	}
	sf.dirty = false
	sf.mu.Lock()
	defer sf.mu.Unlock()
	for m := range sf.members {
		m.wakeUp()
	}
	return nil
}

// broken: a shared feed's writes never fail; a member that cannot keep up is ended alone (sink).
func (sf *sharedFeed) broken() (EndReason, error) { return endNone, nil }

// gone says the feed's last subscriber left and none joined in the grace (sink).
func (sf *sharedFeed) gone() bool { return sf.idle.Load() }

// relist sends every member the ERROR 410 st; the feed ends after it (sink).
func (sf *sharedFeed) relist(st *metav1.Status) {
	if sf.writer.WriteStatus(st) != nil {
		return
	}
	raw := sf.frame.take()
	sf.mu.Lock()
	sf.fanOut(raw, false, 0, false)
	sf.mu.Unlock()
	_ = sf.flush()
}

// sharedHeaders are the headers of a feed's first answer that describe the stream, the same for
// every request of its key, and so are every subscriber's. The rest are the opener's request's
// own: its Audit-Id (the apiserver's audit log names the opener under it), the API Priority and
// Fairness flow schema and priority level it was classified into
// (X-Kubernetes-Pf-Flowschema-Uid, X-Kubernetes-Pf-Prioritylevel-Uid: an admin's is exempt),
// and whatever else an apiserver or a proxy before it adds.
var sharedHeaders = []string{"Content-Type", "Cache-Control", "X-Content-Type-Options", "Warning"}

// feedHeaders is the part of a feed's first answer's headers h that every subscriber gets.
func feedHeaders(h http.Header) http.Header {
	out := make(http.Header, len(sharedHeaders))
	for _, k := range sharedHeaders {
		if v := h.Values(k); len(v) > 0 {
			out[k] = append([]string(nil), v...)
		}
	}
	return out
}

// frameCapture is what the feed's Writer writes one frame into: each Write is one whole frame
// (stream.Writer), copied, since the reader's buffer and the Writer's are reused.
type frameCapture struct{ b []byte }

func (c *frameCapture) Write(p []byte) (int, error) {
	c.b = append(make([]byte, 0, len(p)), p...)
	return len(p), nil
}

func (c *frameCapture) take() []byte {
	b := c.b
	c.b = nil
	return b
}

// member is one subscriber of a shared feed: its queue of frames, bounded in bytes, that the
// feed appends to and its writer (its client's request goroutine, or its detached writer)
// writes out. What it holds is what it counts against its bound (docs/design.md section 11,
// "Bounds"): each frame queued or being written, its bytes and its entry (queue.EntryCost).
// The frames are shared with the ring and the other members; its entries, and the blocks that
// hold them (queue.Frames: at most a block's worth beyond what it counts), are its own.
type member struct {
	bookmarks bool
	max       int
	wake      chan struct{} // capacity 1: something to take
	// skip, when not 0, is the resourceVersion up to which the member's client has what the
	// feed delivers: a watch-list handed off ahead of the feed (handoff.go). The feed's mu
	// guards it.
	skip uint64
	// access, for a reviewed member, is what its review was made with (share_state.go); nil
	// for the lent identity. Set under the registry's lock and the feed's mu.
	access *memberAccess

	// queued, frames and since say how far the member is behind its feed, for /debug/feeds
	// (feeds_debug.go), which reads them without its lock: the bytes and frames queued and
	// not yet taken, and when the oldest of them was queued (unix nanoseconds; 0: none).
	queued, since atomic.Int64
	frames        atomic.Int32

	mu sync.Mutex
	q  queue.Frames
	// bytes is what q holds, counted (each frame's length and queue.EntryCost); writing, what
	// the writer took from it and has not written yet (take, written), counted the same way:
	// bytes+writing is bounded by max.
	bytes, writing int
	signal         bool      // frames were queued since the last take
	over           bool      // the queue filled: the member is off the feed and ends (EndSlowClient)
	end            EndReason // the feed ended: the member ends after its queue
	done           bool
	// det, once set, is the member's own connection and writer (detach.go): wakes start its
	// writer instead of waking a handler.
	det *detached
	// mem is the member's account of the memory budget, charged queue.EntryCost for each entry
	// of its queue (the frames are the feed's), opened when it joins and closed when it leaves
	// or its feed ends; nil: nothing charged. writingEntries is how many of the entries the
	// writer took are unwritten (m.mu).
	mem            *budget.Account
	writingEntries int
}

// push queues raw, or reports false when it would fill the queue past its bound: the member is
// then over (its queue let go) and ends.
func (m *member) push(raw []byte, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.over {
		return false // ended by the memory budget (overBudget): the feed lets it go
	}
	cost := len(raw) + queue.EntryCost
	// Past its own bound, or refused by the memory budget (it holds more than its share of
	// what is left): ended as the apiserver ends a watcher that cannot keep up.
	if m.bytes+m.writing+cost > m.max || !m.mem.Take(budget.Queues, int64(queue.EntryCost)) {
		m.over, m.bytes = true, 0
		m.mem.Give(budget.Queues, int64(m.q.Len()*queue.EntryCost))
		m.q.Reset()
		m.account()
		m.wakeLocked()
		return false
	}
	if m.q.Len() == 0 {
		m.since.Store(now.UnixNano())
	}
	m.q.Push(raw)
	m.bytes += cost
	m.signal = true
	m.account()
	return true
}

// overBudget ends the member as over its bound (push), asked by the memory budget: past its
// high mark, this member held the most beyond its fair share.
func (m *member) overBudget() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.over || m.done {
		return
	}
	m.over, m.bytes = true, 0
	m.mem.Give(budget.Queues, int64(m.q.Len()*queue.EntryCost))
	m.q.Reset()
	m.account()
	m.wakeLocked()
}

// account publishes the queue's size for /debug/feeds; m.mu is held.
func (m *member) account() {
	m.queued.Store(int64(m.bytes + m.writing))
	m.frames.Store(int32(m.q.Len()))
	if m.q.Len() == 0 {
		m.since.Store(0)
	}
}

// wakeUp tells the member's goroutine there is something to take, if there is.
func (m *member) wakeUp() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.signal {
		m.wakeLocked()
	}
}

func (m *member) wakeLocked() {
	m.signal = false
	if m.det != nil { // it owns its connection: its writer runs while there is something (detach.go)
		m.det.kickLocked()
		return
	}
	select {
	case m.wake <- struct{}{}:
	default: // woken already
	}
}

// finish ends the member after what it has queued, with end (endNone: the feed never started).
func (m *member) finish(end EndReason) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.end, m.done = end, true
	m.wakeLocked()
}

// take returns the oldest frames queued, at most limit bytes of them (at least one), and
// whether the member is over or its feed ended (and how). They stay counted against the bound
// until the writer says it wrote them (written): a writer blocked on its client holds them.
func (m *member) take(limit int) (q [][]byte, over, done bool, end EndReason) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.takeLocked(limit), m.over, m.done, m.end
}

// takeLocked is take's; m.mu is held.
func (m *member) takeLocked(limit int) [][]byte {
	k, n := m.q.PeekUpTo(limit)
	if k == 0 {
		return nil
	}
	q := make([][]byte, k)
	for i := range q {
		q[i] = m.q.Pop()
	}
	cost := n + k*queue.EntryCost
	m.bytes -= cost
	m.writing += cost
	m.writingEntries += k
	m.account()
	return q
}

// written says the writer is done with what it took: written out, or dropped with its stream.
func (m *member) written() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.writing = 0
	m.mem.Give(budget.Queues, int64(m.writingEntries*queue.EntryCost))
	m.writingEntries = 0
	m.account()
}

// serve answers the client r from the member m of the feed until its stream ends: the feed's
// first answer's headers, then every frame queued, written and flushed in batches, until the
// client leaves, its timeoutSeconds passes, its queue fills or the feed ends.
//
// On HTTP/1.1 the member takes the connection once the head is out, and the handler returns
// (detach.go); the head then says the connection closes after the stream (Connection: close),
// since no handler is left to read a next request on it.
func (sf *sharedFeed) serve(w http.ResponseWriter, r *http.Request, m *member, p params, requestID string) {
	h := sf.h
	hdr := sf.header
	if m == sf.opener {
		hdr = sf.openerHeader
	}
	upstream.CopyEndToEnd(w.Header(), hdr)
	w.Header().Del("Content-Length")
	detach := r.ProtoMajor == 1 && r.ProtoMinor >= 1 && !h.noDetach && !h.stopping()
	if detach {
		w.Header().Set("Connection", "close")
	}
	w.WriteHeader(http.StatusOK)
	if detach && sf.detach(w, r, m, p, requestID) {
		return
	}
	sf.serveAttached(w, r, m, p, requestID)
}

// serveAttached is serve on the handler's goroutine, which writes the member's queue.
func (sf *sharedFeed) serveAttached(w http.ResponseWriter, r *http.Request, m *member, p params, requestID string) {
	h := sf.h
	met := h.deps.Metrics
	resource := sf.pol.resource
	open := met.OpenWatches.WithLabelValues(resource)
	open.Inc()
	defer open.Dec()
	defer sf.leave(m)

	var deadline <-chan struct{}
	if p.timeout > 0 {
		dl := make(chan struct{})
		t := h.clk.AfterFunc(p.timeout, func() { close(dl) })
		defer t.Stop()
		deadline = dl
	}
	var rebalance chan struct{} // closed by Deps.Rebalance's end
	if h.deps.Rebalance != nil {
		rebalance = make(chan struct{})
		var once sync.Once
		defer h.deps.Rebalance(r, func() { once.Do(func() { close(rebalance) }) })()
	}
	out := chunked.NewBatch(w, http.NewResponseController(w), h.cfg.WriteTimeout, m.mem)
	end := sf.pump(r, m, &out, deadline, p.deadlineEnd(), rebalance)
	met.StreamEnds.WithLabelValues(end.String()).Inc()
	if end == EndSlowClient { // its queue filled, or a write to it did not complete in time
		met.SharedSlowSubscribers.Inc()
	}
	if ce := sf.log.Check(zap.DebugLevel, "shared watch ended"); ce != nil {
		ce.Write(zap.String("remote", r.RemoteAddr), zap.String("requestID", requestID), zap.Stringer("reason", end))
	}
}

// left is how the stream of the subscriber r that left ends (Handler.leftEnd); a slow one is
// counted with the feed's policy, as one whose write failed at its deadline.
func (sf *sharedFeed) left(r *http.Request) EndReason {
	end := sf.h.leftEnd(r)
	if end == EndSlowClient {
		sf.slowClient(slowEvents)
	}
	return end
}

// slowClient counts and logs a subscriber cut because its client did not take a write within
// the write timeout (Handler.slowClient).
func (sf *sharedFeed) slowClient(what string) { sf.h.slowClient(sf.log, sf.pol.path, what) }

// pump is serve's loop; it returns how the client's stream ended: atDeadline when deadline is
// closed, EndRebalance when rebalance is (nil: never).
func (sf *sharedFeed) pump(r *http.Request, m *member, out *chunked.Batch, deadline <-chan struct{}, atDeadline EndReason, rebalance <-chan struct{}) EndReason {
	if out.FlushClient() != nil {
		return sf.left(r)
	}
	// When the client left: the taken connection's reader says so (a handed-off watch-list's
	// client whose private stream took its connection, handoff.go, and whose handler has
	// returned), else the request's context, net/http's own reader.
	left := r.Context().Done()
	if c := out.Conn(); c != nil {
		left = c.Left()
	}
	for {
		select {
		case <-m.wake:
		case <-left:
			return sf.left(r)
		case <-deadline:
			return atDeadline
		case <-rebalance:
			return EndRebalance
		}
		var over, done bool
		var end EndReason
		for {
			var q [][]byte
			q, over, done, end = m.take(chunked.BatchSize)
			for _, raw := range q {
				_, _ = out.Write(raw) // an error is sticky: flush returns it
			}
			m.written() // copied into the batch, or written (a frame too big for one)
			if len(q) == 0 || out.Err() != nil {
				break
			}
		}
		if err := out.Flush(); err != nil {
			if out.Slow() {
				sf.slowClient(slowEvents)
				return EndSlowClient
			}
			return sf.left(r)
		}
		switch {
		case over:
			sf.log.Info("a shared feed's subscriber fell its buffer's worth behind; its stream is ended, its client re-watches from its last resourceVersion",
				zap.String("remote", r.RemoteAddr), zap.Int("bufferBytes", m.max))
			return EndSlowClient
		case done:
			if end == endNone {
				end = EndNoResume
			}
			return end
		}
	}
}

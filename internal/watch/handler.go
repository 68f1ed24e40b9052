// Package watch serves one client watch from top to bottom. Its feed (feed.go) is the upstream
// side: the first attempt, and every resume after the upstream breaks and every move, all
// through upstream.Attempter; it reads the upstream's events with internal/stream and hands
// each to its subscriber (subscriber.go), the one client response, where internal/fix decides
// it and the result is written, flushed whenever the feed would wait for the upstream (never
// with an event held back while it waits). How a client watch may
// end (docs/design.md section 5):
//   - cleanly (the client re-watches from its last RV): shutdown, the client's timeoutSeconds
//     or the max lifetime (lifetime.go), resume given up, garbage from upstream;
//   - cut where it is: a write to the client did not complete within the write timeout (a
//     client that stopped reading; its upstream watch is closed, and counted as a slow client,
//     not as the upstream's silence or lag);
//   - with a well-formed ERROR 410 event (the client relists): the resume point is gone;
//   - never with a second status line, and never with a partial event.
package watch

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/utils/clock"

	"github.com/watchsan/watchsan/internal/absorb"
	"github.com/watchsan/watchsan/internal/apistatus"
	"github.com/watchsan/watchsan/internal/budget"
	"github.com/watchsan/watchsan/internal/chunked"
	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/metrics"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/review"
	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/upstream"
)

// Defaults of Config, the flags' defaults.
const (
	DefaultResumeTimeout = 60 * time.Second
	// DefaultStallTimeout is longer than the apiserver's bookmark period (a minute,
	// docs/design.md section 2), so a watch whose resource changes hears a bookmark within it;
	// a caught-up watch of a resource nothing changes hears nothing at all, and is resumed once
	// per stall timeout.
	DefaultStallTimeout = 90 * time.Second
	// DefaultWriteTimeout bounds each write to a watch's client: ample for a client that reads
	// (an event is at most a few MiB), and what a client that stopped reading costs watchsan
	// (its upstream stream window) is held no longer.
	DefaultWriteTimeout = 30 * time.Second
)

// Config tunes every watch. Every field's zero value is usable.
type Config struct {
	// Mode is fix.Repair (the zero value) or fix.Observe; exempt resources use fix.PassAll.
	Mode fix.Mode
	// Exempt lists resources ("pods", "apps/deployments") whose events pass unsanitized.
	Exempt []string
	// MaxFrameSize bounds one upstream event; 0: stream.DefaultMaxFrameSize.
	MaxFrameSize int
	// ResumeTimeout bounds how long a watch is resumed without progress (no event, no
	// bookmark) before the client's stream ends; 0: DefaultResumeTimeout.
	ResumeTimeout time.Duration
	// StallTimeout: an upstream watch that sends nothing, not even a bookmark (watchsan always
	// asks for them), for this long is stalled and resumed, whatever a probe of its upstream
	// says (the hop between may be what hangs; resuming is lossless); 0: DefaultStallTimeout.
	StallTimeout time.Duration
	// DisableResume ends the client's watch when the upstream's breaks.
	DisableResume bool
	// MaxLifetime bounds every client watch stream: one without timeoutSeconds, or with a
	// longer one, ends cleanly after MaxLifetime times a random factor in [1, 2), as the
	// apiserver ends a watch without timeoutSeconds (lifetime.go). 0: DefaultMaxLifetime.
	MaxLifetime time.Duration
	// WriteTimeout bounds each write (and flush) to the client: a watch whose client takes
	// nothing for this long ends, counted as a slow client (EndSlowClient). Time spent writing
	// to the client is never the upstream's silence or lag. 0: DefaultWriteTimeout.
	WriteTimeout time.Duration

	// Absorbing a 410 at a resume point (absorb.go, docs/design.md section 12): a
	// feed whose state is complete answers it with a list and the difference, and no 410
	// reaches its client. DisableAbsorb turns it off (no state is kept). AbsorbStateBytes
	// bounds one feed's state, AbsorbTotalBytes all of them (bytes of objects and their
	// overhead); 0: DefaultAbsorbStateBytes and DefaultAbsorbTotalBytes.
	DisableAbsorb    bool
	AbsorbStateBytes int64
	AbsorbTotalBytes int64
	// AbsorbCompleteByList: a private watch from a client's resourceVersion C that adopts no
	// state lists its scope at exactly C before its first event, to hold a complete state
	// (absorb.go completeByList): one more list per such watch, from etcd. False: such a watch
	// keeps no state.
	AbsorbCompleteByList bool
	// AbsorbParkTime is how long an ended watch's complete state waits for its client's
	// re-watch from its last resourceVersion (package absorb); 0: DefaultAbsorbParkTime.
	AbsorbParkTime time.Duration

	// Shared feeds (share.go). Share serves identical watches of the
	// lent identity from one upstream watch, and those of clients with their own credentials
	// that an access review allowed (package review) from another; the bounds' zero values are their
	// defaults.
	Share                bool
	ShareRingBytes       int           // a feed's ring of recent events, bytes; 0: DefaultShareRingBytes
	ShareRingEvents      int           // and events; 0: DefaultShareRingEvents
	ShareSubscriberBytes int           // how far behind its feed a subscriber may be; 0: DefaultShareSubscriberBytes
	ShareGrace           time.Duration // how long a feed outlives its last subscriber; 0: DefaultShareGrace
	// ShareReviewEntries bounds the cache of access reviews (package review), oldest out; 0:
	// DefaultShareReviewEntries.
	ShareReviewEntries int
	// ShareExclude lists resources ("secrets", "coordination.k8s.io/leases") whose watches
	// never share (privateExcluded).
	ShareExclude []string
	// ShareMaxFeeds bounds the shared feeds open at once; a watch that would open one more
	// gets a private feed (privateFeedLimit). 0: DefaultShareMaxFeeds.
	ShareMaxFeeds int
	// ShareReviewedWatchLists lets a watch-list with credentials of its own hand off onto a
	// shared feed once an access review at its bookmark allowed it (handoff.go); false: only
	// the lent identity's watch-lists hand off, the others stay private (privateWatchList).
	ShareReviewedWatchLists bool
	// ShareRingTotalBytes bounds all feeds' rings together (ring.Budget); 0:
	// DefaultShareRingTotalBytes.
	ShareRingTotalBytes int64
}

// Deps are what a Handler works with, given at construction.
type Deps struct {
	// Attempts sends the first attempt and every resume of each watch; required.
	Attempts *upstream.Attempter
	// Metrics counts events, resumes and endings; required.
	Metrics *metrics.Metrics
	// Memory carries rewritten deletes across a client's re-watches; nil: none.
	Memory *fix.DeleteMemory
	// Done, when closed, ends every watch cleanly (shutdown); nil: never.
	Done <-chan struct{}
	// Logger is named "watch" below; nil: no logging.
	Logger *zap.Logger
	// OnBreak, if set, is told every upstream watch attempt that broke and is resumed, with
	// its backend (still a member of the pool when told) and why (per-upstream metrics).
	OnBreak func(b *upstream.Backend, r ResumeReason)
	// Note, if set, is told what a watch did that the status page lists as it happens: kind
	// "absorb" (a 410 absorbed), "relist" (a 410 sent to the client, which relists) or
	// "rewrite" (a stream ended with events rewritten or dropped), with the backend (nil: not
	// known), the client's path and a detail. It must not block.
	Note func(kind string, b *upstream.Backend, path, detail string)
	// Clock is every watch's clock: the client's deadline, the stall watchdog, how long a
	// resume takes and when it gives up, a move's acceptance window and its fresh-resume-point
	// probe. Give Attempts the same one (upstream.AttempterOptions.Clock), which waits out the
	// resume backoff. Write deadlines toward clients are the network's and stay on the real
	// clock, as does what the Pool judges (health, lag). Nil: the real clock.
	Clock clock.WithDelayedExecution
	// ServedLocally says whether the kube-apiserver serves the API group-version itself (a
	// built-in group, a CRD's), not an aggregated server behind an APIService with a service,
	// which receives the user and may answer each one differently (package localapi). Reviewed
	// clients of different identities share a feed only where it says so (feedPrincipal). Nil:
	// no group-version is known to be served locally, and reviewed clients share only with
	// the same identity.
	ServedLocally func(group, version string) bool
	// CutSlow says whether the client's connection was closed because it took no byte for
	// the write timeout (an HTTP/2 client that stopped reading is cut by the server's
	// write-byte timeout, the connection as a whole, before any watch's own write fails): its
	// watch ended as a slow client, not a gone one. Nil: never.
	CutSlow func(r *http.Request) bool
	// Rebalance, if set, is told each client watch once its stream has begun, with end, which
	// ends the stream cleanly (EndRebalance: as at its deadline, the last chunk on HTTP/1.1,
	// the stream's end on HTTP/2) so that its client re-watches from its last resourceVersion;
	// the server calls it for the watches of a connection it sheds (docs/design.md section
	// 10.12). end may be called from any goroutine, more than once, and after the stream
	// ended; the watch calls the stop Rebalance returns once its stream ended. A watch-list
	// handed off onto a shared feed (handoff.go) is not told. Nil: no watch is ended so.
	Rebalance func(r *http.Request, end func()) (stop func())
	// Budget is the process's memory budget: each watch and shared feed charges it for the
	// frames it reads, each shared subscriber for its queue (package budget). Nil: nothing is
	// charged, and only each buffer's own bound applies.
	Budget *budget.Budget
}

// Handler serves watch requests.
type Handler struct {
	cfg    Config
	deps   Deps
	exempt map[string]bool
	log    *zap.Logger
	clk    clock.WithDelayedExecution // deps.Clock
	feeds  *registry                  // the open shared feeds (Config.Share, share.go)
	// reviews caches what the apiserver said of clients' own credentials (package review,
	// review.go); set by New.
	reviews *review.Cache
	// live holds every open watch's feed while Done is open; at shutdown each one's context
	// is ended (errShutdown) and stopped is set, so that a watch opened after ends at once. A
	// set, not a callback per watch (context.AfterFunc on a shutdown context was about 200
	// bytes of every idle watch), nor a goroutine per watch.
	mu      sync.Mutex
	live    map[*feed]struct{}
	stopped bool
	// conns holds the connections watches took (package chunked) until they are released:
	// the detached shared watches' (detach.go, classDetached) and the private ones'
	// (subscriber.start, classOwned). WaitDetached waits on it.
	conns chunked.Set
	// noDetach keeps every shared subscriber on its handler, noOwn every private watch on
	// net/http's writer (tests comparing the two).
	noDetach, noOwn bool
	// counters holds each resource label's *eventCounters (subscriber.go).
	counters sync.Map

	// stateBudget is what all feeds' states share, parked holds those of ended watches for
	// their clients' re-watches (package absorb); both set by New.
	stateBudget *absorb.Budget
	parked      *absorb.Parked
	// clientLists are the clients' lists being read to be parked, clientPages those read a
	// page at a time waiting for their next page (listtee.go, their only writer); the zero
	// values: none.
	clientLists clientLists
	clientPages clientPages
}

// New builds a Handler.
func New(cfg Config, d Deps) (*Handler, error) {
	if d.Attempts == nil || d.Metrics == nil {
		return nil, errors.New("watch.New: Attempts and Metrics are required")
	}
	if cfg.Mode != fix.Repair && cfg.Mode != fix.Observe {
		return nil, errors.New("watch.New: Mode must be Repair or Observe")
	}
	def := func(v *time.Duration, dv time.Duration) {
		if *v <= 0 {
			*v = dv
		}
	}
	def(&cfg.ResumeTimeout, DefaultResumeTimeout)
	def(&cfg.StallTimeout, DefaultStallTimeout)
	def(&cfg.WriteTimeout, DefaultWriteTimeout)
	def(&cfg.MaxLifetime, DefaultMaxLifetime)
	if cfg.MaxFrameSize <= 0 {
		cfg.MaxFrameSize = stream.DefaultMaxFrameSize
	}
	defInt := func(v *int, dv int) {
		if *v <= 0 {
			*v = dv
		}
	}
	defInt(&cfg.ShareRingBytes, DefaultShareRingBytes)
	defInt(&cfg.ShareRingEvents, DefaultShareRingEvents)
	if cfg.ShareRingTotalBytes <= 0 {
		cfg.ShareRingTotalBytes = DefaultShareRingTotalBytes
	}
	defInt(&cfg.ShareSubscriberBytes, DefaultShareSubscriberBytes)
	def(&cfg.ShareGrace, DefaultShareGrace)
	defInt(&cfg.ShareReviewEntries, DefaultShareReviewEntries)
	defInt(&cfg.ShareMaxFeeds, DefaultShareMaxFeeds)
	if cfg.AbsorbStateBytes <= 0 {
		cfg.AbsorbStateBytes = DefaultAbsorbStateBytes
	}
	if cfg.AbsorbTotalBytes <= 0 {
		cfg.AbsorbTotalBytes = DefaultAbsorbTotalBytes
	}
	def(&cfg.AbsorbParkTime, DefaultAbsorbParkTime)
	if d.Logger == nil {
		d.Logger = zap.NewNop()
	}
	if d.Clock == nil {
		d.Clock = clock.RealClock{}
	}
	for _, r := range upstream.MoveReasons() { // every series from the start
		d.Metrics.WatchMovesFailed.WithLabelValues(r.String())
	}
	h := &Handler{cfg: cfg, deps: d, log: d.Logger.Named("watch"), exempt: map[string]bool{}, clk: d.Clock,
		feeds: newRegistry(cfg, d)}
	for _, r := range cfg.Exempt {
		h.exempt[r] = true
	}
	h.reviews = review.New(cfg.ShareReviewEntries, d.Attempts, h.clk, h.log, d.Metrics.SharedAccessReviews)
	h.parked = absorb.NewParked(h.clk, cfg.AbsorbParkTime)
	h.stateBudget = absorb.NewBudget(cfg.AbsorbStateBytes, cfg.AbsorbTotalBytes, d.Metrics.AbsorbStateBytes, d.Budget)
	for _, o := range AbsorbOutcomes { // every series from the start
		d.Metrics.GoneAbsorbed.WithLabelValues(o)
	}
	for _, r := range CompletingListResults {
		d.Metrics.AbsorbCompletingLists.WithLabelValues(r)
	}
	for _, r := range absorb.ClientListResults {
		d.Metrics.AbsorbClientLists.WithLabelValues(r)
	}
	if d.Done != nil {
		h.live = map[*feed]struct{}{}
		go h.shutdown() // one per Handler; exits at shutdown
	}
	return h, nil
}

// shutdown ends every watch's context (errShutdown) once Done is closed.
func (h *Handler) shutdown() {
	<-h.deps.Done
	h.mu.Lock()
	live := h.live
	h.live, h.stopped = nil, true
	h.mu.Unlock()
	for f := range live {
		f.cancel(errShutdown)
	}
}

// track puts f in the set of watches shutdown ends, or ends it at once when shutdown began.
func (h *Handler) track(f *feed) {
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		f.cancel(errShutdown)
		return
	}
	h.live[f] = struct{}{}
	h.mu.Unlock()
	f.tracked = true
}

// untrack takes f out of that set (release).
func (h *Handler) untrack(f *feed) {
	h.mu.Lock()
	delete(h.live, f) // nil once shutdown took it: a no-op
	h.mu.Unlock()
}

// Causes that end a watch's context; the feed sorts endings by them.
var (
	errShutdown       = errors.New("watchsan is shutting down")
	errClientDeadline = errors.New("the client's timeoutSeconds passed")
	errStalled        = errors.New("upstream watch stalled")
	errOverBudget     = errors.New("the watch held the most of the memory budget past its high mark")
	errRebalance      = errors.New("the server sheds the client's connection (Deps.Rebalance)")
)

// params are the watch parameters that matter to watchsan, read from the request's query
// once, where the request is classified (Serve), and passed on as a value: nothing below parses
// the client's query or its resourceVersion again.
type params struct {
	// query is the client's query as parsed; never modified: what builds a request of its
	// own from it copies it first (copyQuery). Nil: no parameters.
	query url.Values
	rv    string
	// rvInt is rv as an integer, rvIsInt says it is one (stream.ParseRV; false for "").
	rvInt   uint64
	rvIsInt bool
	// sendInitialEvents is its value, hasSendInitialEvents says it was given at all;
	// rvMatch is resourceVersionMatch ("" when not given). Either given: a watch-list.
	sendInitialEvents    bool
	hasSendInitialEvents bool
	rvMatch              string
	hasRVMatch           bool
	allowBookmarks       bool
	// timeout is the client's timeoutSeconds: 0 none given (or 0, which the apiserver takes
	// as none), negative: already over (the apiserver ends such a watch at once). Once
	// Handler.bound applied the max lifetime, it is never 0.
	timeout time.Duration
	// maxLifetime: timeout is the lifetime Handler.bound drew (the client gave no
	// timeoutSeconds, or a longer one); false: the client's own.
	maxLifetime bool
	// scope names what the watch selects, whoever asks: every watch of one scope gets the
	// same events, so one that stays behind another's is lagging (upstream.Plan.Scope).
	scope string
}

// parseParams reads r's query once (each parse of it is about 400 bytes of garbage per watch).
func parseParams(r *http.Request) params {
	q := r.URL.Query()
	p := params{query: q, rv: q.Get("resourceVersion"), rvMatch: q.Get("resourceVersionMatch")}
	p.rvInt, p.rvIsInt = stream.ParseRV(p.rv)
	p.sendInitialEvents = parseBool(q.Get("sendInitialEvents"))
	p.hasSendInitialEvents, p.hasRVMatch = q.Has("sendInitialEvents"), q.Has("resourceVersionMatch")
	p.allowBookmarks = parseBool(q.Get("allowWatchBookmarks"))
	p.scope = selectsOf(r.URL.Path, q)
	if s, err := strconv.ParseInt(q.Get("timeoutSeconds"), 10, 64); err == nil && s != 0 {
		p.timeout = time.Duration(max(min(s, 1<<31), -1)) * time.Second
	}
	return p
}

// watchList says whether the watch is a watch-list (sendInitialEvents or resourceVersionMatch
// given).
func (p params) watchList() bool { return p.hasSendInitialEvents || p.hasRVMatch }

// selectsOf is params.scope of a watch of path with the query q: its resource's path and its
// selectors.
func selectsOf(path string, q url.Values) string {
	return strings.Replace(path, "/watch/", "/", 1) + "?l=" + q.Get("labelSelector") + "&f=" + q.Get("fieldSelector")
}

// copyQuery is a copy of q that may be changed without changing q.
func copyQuery(q url.Values) url.Values {
	c := make(url.Values, len(q)+1)
	for k, v := range q {
		c[k] = v[:len(v):len(v)] // a Set replaces the slice; an Add copies it
	}
	return c
}

// parseBool is strconv.ParseBool, false for what it refuses, without the error it would
// allocate for a parameter not given.
func parseBool(s string) bool {
	if s == "" {
		return false
	}
	b, _ := strconv.ParseBool(s)
	return b
}

// scopeOf identifies a watch for the rewritten-delete memory: what it selects (selects,
// params.scope), and who the upstream takes it for (cred's Principal: the lent identity, a
// verified certificate's identity or a token, as digests, never the credentials), so one
// client's remembered deletes never suppress a delete another client has not seen. Found in review: a
// digest of the Authorization header alone put every certificate client, and every lent or
// anonymous one, in one scope, and after alice's watch had a regressed delete rewritten, bob,
// watching from that resourceVersion, never saw the delete.
func scopeOf(selects string, cred upstream.Credentials) string {
	return selects + "&u=" + cred.Principal()
}

// ServeHTTP serves one watch request, classifying it first and sending it with what it
// carries, never lent (as a request no guard decided on); its log lines carry no request id.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	info, cred := reqinfo.Parse(r), upstream.Decide(r.Header, r.TLS, false, upstream.IdentityOff)
	h.Serve(w, r, &info, &cred, "")
}

// Serve serves one watch request that info (reqinfo.Parse(r)) classifies, every attempt of it
// with cred, whose credentials the server decided on the request as the client sent it
// (upstream.Decide; the zero value: as ServeHTTP). Every line logged about it carries the
// client's address and requestID, the id of its access log line. Neither info nor cred is
// kept: they are passed by reference only so that no frame below the watch's holds copies.
//
// A watch that owns its HTTP/1.1 connection (subscriber.start) goes on in a goroutine of its
// own once its head is out, and Serve returns. Otherwise its goroutine spends the watch's life
// parked in a read from the upstream, every frame of Serve and its callers kept on its stack
// all that time: the setup and the first attempt (open) and what is done once the watch ended
// (ended) are functions of their own that have returned (or not begun) while it waits, so that
// what stays is small. The runtime halves a goroutine's stack at a GC only while it uses less
// than a quarter of it: the parked handler's frames under 4 KiB are 8 KiB of stack per idle
// watch instead of 16 (docs/bench/NOTES.md, "Idle memory").
func (h *Handler) Serve(w http.ResponseWriter, r *http.Request, info *reqinfo.Info, cred *upstream.Credentials, requestID string) {
	// Its stream's lifetime bounds, for a reviewed subscriber of a shared feed, how long its
	// review is trusted: it is reviewed again when it re-watches (package review, lifetime.go).
	p := h.bound(parseParams(r))
	h.awaitClientList(r, p, *cred) // its own list's state, parked as the list ends (listtee.go)
	var ho *handoff
	if h.cfg.Share {
		var served bool
		if served, ho = h.serveShared(w, r, info, *cred, p, requestID); served {
			return // served by a shared feed (share.go); else a private feed, as without sharing
		}
	}
	f, sub, src := h.open(w, r, info, cred, p, requestID)
	if f == nil {
		if ho != nil {
			ho.endedBefore(h)
		}
		return
	}
	if ho != nil {
		f.handoff = ho
		ho.attach(sub)
	}
	if sub.out.Conn() != nil {
		// The watch owns its connection (subscriber.start): it goes on in a goroutine of its
		// own and the handler returns, so that net/http lets go of what it keeps for the
		// connection while a handler runs (its 4 KiB read and write buffers, the response)
		// and no parked frame of net/http's or the server's stays on a stack for the watch's
		// life
		// (docs/design.md section 5, "One write per flush"). The server counts the request's
		// end when the connection is closed (Detacher); shutdown waits for it (WaitDetached).
		f.unfollow()
		go serveOwned(f, sub, src) // exits when the watch ends
		return
	}
	defer sub.out.Finish() // after the release: the body's end is the response's
	defer f.release()
	serve(f, sub, src)
}

// serveOwned is Serve's end for a watch that owns its connection, in a goroutine of its own.
// net/http recovers a handler's panic, and ends only its connection; so does this: a panic
// is logged with its stack, and the deferred ends close the watch's connection and feed.
func serveOwned(f *feed, sub *subscriber, src *source) {
	defer func() {
		if p := recover(); p != nil {
			if ce := f.log.Check(zapcore.ErrorLevel, "panic serving a watch"); ce != nil {
				ce.Write(zap.Any("panic", p), zap.Stack("stack"))
			}
		}
	}()
	defer sub.out.Finish() // after the release: the body's end is the response's
	defer f.release()
	serve(f, sub, src)
}

// open sets the watch r (its parameters p) up and sends its first attempt: the feed and the
// attempt's source, or nil when the request was answered (an error, or a response relayed as it
// came) and there is nothing more to do. Unless it returns nil, the caller calls the feed's
// release when done.
func (h *Handler) open(w http.ResponseWriter, r *http.Request, info *reqinfo.Info, credp *upstream.Credentials, p params, requestID string) (*feed, *subscriber, *source) {
	cred := *credp
	if cred.Principal() == "" {
		cred = upstream.Decide(r.Header, r.TLS, false, upstream.IdentityOff)
	}
	m := h.deps.Metrics

	// The watch ends with the request's context only while its handler runs: net/http cancels
	// it when the handler returns, and a watch that owns its connection outlives that (Serve).
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(r.Context()))
	unfollow := context.AfterFunc(r.Context(), func() { cancel(context.Cause(r.Context())) })
	log := newWatchLog(h.log, r.RemoteAddr, requestID)
	mem := h.deps.Budget.OpenEnding(func() { cancel(errOverBudget) })
	sub := newSubscriber(h, w, r, p, m.Resource(info.FullResource()), log, mem)
	f := &feed{
		h: h, client: r, query: p.query, ctx: ctx, cancel: cancel, unfollow: unfollow, cred: cred, log: log, sub: sub, timeout: p.timeout, maxLifetime: p.maxLifetime,
		backoff: upstream.ResumeBackoff, scope: p.scope, groupResource: info.GroupResource(), mem: mem,
	}
	switch {
	case p.timeout > 0:
		f.deadline = h.clk.Now().Add(p.timeout)
		f.stopDeadline = h.clk.AfterFunc(p.timeout, func() { cancel(errClientDeadline) })
	case p.timeout < 0:
		f.deadline = h.clk.Now() // over already: the first attempt is the only one
	}
	if h.deps.Done != nil {
		h.track(f)
	}

	first, err := h.deps.Attempts.Do(ctx, f.requestFrom(true, ""), f.plan(p.rvInt))
	if err != nil {
		defer f.release()
		if r.Context().Err() != nil {
			return nil, nil, nil
		}
		if errors.Is(context.Cause(ctx), errShutdown) {
			// A re-watch that reached this replica after its watches were ended: retried by
			// the client on a new connection, never a relist (apistatus.ShuttingDown).
			apistatus.WriteClose(w, apistatus.ShuttingDown())
			return nil, nil, nil
		}
		st := apistatus.ForUpstreamError(upstream.Name(err), err)
		lvl := zapcore.WarnLevel
		if errors.Is(err, upstream.ErrNoBackend) {
			lvl = zapcore.DebugLevel // the outage is logged once, at its transition; not per request
		}
		if ce := log.Check(lvl, "upstream failed before the response started"); ce != nil {
			ce.Write(zap.String("path", r.URL.Path), zap.Int32("code", st.Code), zap.Error(err))
		}
		apistatus.Write(w, st)
		return nil, nil, nil
	}
	format, ok := f.firstAnswer(first)
	if !ok {
		// Not a stream we can read (an error status, a content type we do not parse): relay.
		defer f.release()
		if relay(sub.w, &sub.out, first) {
			sub.slowClient(slowRelayed)
		}
		return nil, nil, nil
	}
	mode := h.cfg.Mode
	if h.exempt[info.GroupResource()] {
		mode = fix.PassAll
	}
	f.openState(r, cred, p, format) // the state it keeps to absorb a 410 (absorb.go)
	if h.deps.Rebalance != nil {
		f.unrebalance = h.deps.Rebalance(r, func() { cancel(errRebalance) })
	}
	sub.start(format, first.Resp.Header, fix.NewStream(fix.Options{
		Scope: scopeOf(p.scope, cred), StartRV: p.rv, SendInitialEvents: p.sendInitialEvents,
		Mode: mode, Memory: h.deps.Memory,
	}), func() { cancel(nil) })
	return f, sub, f.source(first)
}

// serve runs the feed f of the subscriber sub from its first attempt src until the client's
// stream ends, counted as an open watch meanwhile.
func serve(f *feed, sub *subscriber, src *source) {
	open := f.h.deps.Metrics.OpenWatches.WithLabelValues(sub.resource)
	open.Inc()
	defer open.Dec()
	end := f.run(src)
	if ho := f.handoff; ho != nil && ho.ended(f, end) {
		return // its client was served as a shared feed's subscriber till its end (handoff.go)
	}
	ended(f, sub, end)
}

// ended counts and logs how the watch's stream ended.
func ended(f *feed, sub *subscriber, reason EndReason) {
	f.h.deps.Metrics.StreamEnds.WithLabelValues(reason.String()).Inc()
	if reason == EndSlowClient {
		sub.slowClient(slowEvents)
	}
	if ce := f.log.Check(zapcore.DebugLevel, "watch ended"); ce != nil {
		ce.Write(zap.String("path", f.client.URL.Path), zap.Stringer("reason", reason), zap.Uint64("events", f.events),
			zap.Int("resumes", f.resumes), zap.String("lastRV", sub.LastDelivered()))
	}
	sub.logEnd(reason)
}

// leftEnd is how the stream of a client that left (its request's context ended, or a write
// failed without its deadline) ends: as a slow client when its connection was cut for taking
// no byte (Deps.CutSlow), else as gone.
func (h *Handler) leftEnd(r *http.Request) EndReason {
	if h.deps.CutSlow != nil && h.deps.CutSlow(r) {
		return EndSlowClient
	}
	return EndClientGone
}

// release stops what open started for the watch's life: its deadline's timer, its place in
// the set shutdown ends, its context.
func (f *feed) release() {
	if f.stopDeadline != nil {
		f.stopDeadline.Stop()
	}
	if f.tracked {
		f.h.untrack(f)
	}
	if f.unrebalance != nil {
		f.unrebalance()
	}
	if f.unfollow != nil {
		f.unfollow()
	}
	f.mem.Close()
	// Complete at the last delivered resourceVersion: parked for the client's re-watch from it
	// (absorb.go); after a handoff onto a shared feed, nothing anyone can use.
	f.parkState(!f.handoff.handedOff())
	f.cancel(nil)
}

func identity(h http.Header) bool {
	ce := h.Get("Content-Encoding")
	return ce == "" || ce == "identity"
}

// relay copies a response as it is to w, through out (w's), flushing each read, and ends the
// attempt. Each write has out's timeout; it reports whether the client did not take one within
// it.
func relay(w http.ResponseWriter, out *chunked.Batch, at upstream.Attempt) (slow bool) {
	resp := at.Resp
	defer at.Cancel(nil)
	defer resp.Body.Close()
	upstream.CopyEndToEnd(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			_, _ = out.Write(buf[:n])
			if out.Flush() != nil {
				return out.Slow()
			}
		}
		if err != nil {
			return false
		}
	}
}

// stopping reports whether Done is closed (shutdown), before the watch's context may say so.
func (h *Handler) stopping() bool {
	select {
	case <-h.deps.Done: // a nil Done never is
		return true
	default:
		return false
	}
}

// note tells Deps.Note, if set.
func (h *Handler) note(kind string, b *upstream.Backend, path, detail string) {
	if h.deps.Note != nil {
		h.deps.Note(kind, b, path, detail)
	}
}

package watch

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/absorb"
	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/upstream"
)

// A feed's side of absorbing a 410 at its resume point (docs/design.md section 12; package
// absorb decides and returns the events): which state a feed keeps, sending an absorb's events
// through the feed's sink, fetching a list's pages upstream, counting and logging. The feed's
// hold on its state (feed.abs) is changed here only (share_state.go decides a shared feed's and
// asks holdState, noState, parkState, takeState).

// AbsorbOutcomes lists watchsan_watch_gone_absorbed_total's outcomes (to initialise series).
var AbsorbOutcomes = absorb.Outcomes

// Defaults of the state's budgets and parking, the flags' defaults.
const (
	DefaultAbsorbStateBytes = absorb.DefaultStateBytes
	DefaultAbsorbTotalBytes = absorb.DefaultTotalBytes
	DefaultAbsorbParkTime   = absorb.DefaultParkTime
)

// absorbAgent is the User-Agent of an absorb's list, before the client's own.
const absorbAgent = "watchsan-absorb"

// completeFromStart says whether a watch's first upstream request begins with the initial
// state (every object alive as an ADDED first): resourceVersion "" or "0" unless
// sendInitialEvents=false, or a watch-list (sendInitialEvents=true).
func completeFromStart(p params) bool {
	if p.hasSendInitialEvents {
		return p.sendInitialEvents
	}
	return p.rv == "" || p.rv == "0"
}

// openState gives a new private feed, answered in format, the state it keeps: a new one when
// its watch begins with the initial state; from a client's resourceVersion, the one parked by
// the watch of this client's that ended there, else the list at exactly that resourceVersion
// when it can be had (completeByList); else none, and why.
func (f *feed) openState(r *http.Request, cred upstream.Credentials, p params, format stream.Format) {
	h := f.h
	key := stateKey(r, p.query, cred)
	switch {
	case h.cfg.DisableAbsorb:
		return // the zero hold: none, absorbing off
	case f.listCodec() == nil:
		f.abs.None(absorb.Format)
		return
	case completeFromStart(p):
		f.abs.Hold(absorb.NewStateOf(h.stateBudget, format, f.listCodec()), key)
		return
	}
	f.abs.None(absorb.NotComplete)
	if !p.rvIsInt {
		return
	}
	if s := h.parked.Adopt(key, p.rv); s != nil && s.Format() == format && s.Table() == stream.IsTable(f.listCodec()) {
		f.abs.Hold(s, key)
		return
	} else if s != nil {
		s.Free() // built from frames of another format than this stream's
	}
	if h.cfg.AbsorbCompleteByList {
		f.completeByList(key, p.rv)
	}
}

// holdState makes s, parked by key when the feed ends, the state the feed keeps.
func (f *feed) holdState(s *absorb.State, key string) { f.abs.Hold(s, key) }

// noState frees the state the feed keeps, if any: from now on it keeps none, why says why (an
// AbsorbOutcomes value).
func (f *feed) noState(why string) { f.abs.None(why) }

// takeState moves the feed's state out (a handoff's, share_state.go): from then on the feed
// keeps none.
func (f *feed) takeState() (*absorb.State, string) { return f.abs.Take() }

// absorbingSink is a sink that serves many clients (a shared feed, share_state.go), which an
// absorb tells when its events begin and end and asks to judge its subscribers' access: from
// absorbBegin to absorbEnd no one joins it, absorbAdmit ends alone each subscriber who may not
// list the scope (with the 410 st), and absorbEnd starts its joinable history over at the
// list's resourceVersion L (docs/design.md section 12, "Shared feeds"). The feed's goroutine
// calls all three. A private feed's subscriber is none: its one client asked for the list.
type absorbingSink interface {
	sink
	absorbBegin()
	absorbAdmit(st *metav1.Status)
	absorbEnd(L uint64)
}

// parkState parks the state the feed keeps as it ends, complete at its last delivered
// resourceVersion, for the next watch from there (absorb.Parked); else, or when usable is false
// (its first attempt failed; it was moved onto a shared feed), frees it.
func (f *feed) parkState(usable bool) {
	switch {
	case f.abs.State() == nil:
	case !usable:
		f.abs.Free()
	default:
		f.abs.Park(f.h.parked, f.format, f.sub.LastDelivered(), f.sub.InInitialPhase())
	}
}

// keepsState says whether the feed keeps a state (observeState, for every event it delivers).
func (f *feed) keepsState() bool { return f.abs.State() != nil }

// listCodec is the list codec of the feed's format and its client's Accept
// (stream.ListCodecForAccept: the Table codec for kubectl's Table rows), nil when absorbing
// reads none.
func (f *feed) listCodec() stream.ListCodec {
	return stream.ListCodecForAccept(f.format, f.client.Header.Get("Accept"))
}

// stateInFormat lets the state go when the feed's format is one absorbing does not read, or
// another one than the state's frames'.
func (f *feed) stateInFormat() {
	if s := f.abs.State(); s != nil && (f.listCodec() == nil || s.Format() != f.format || s.Table() != stream.IsTable(f.listCodec())) {
		f.noState(absorb.Format)
	}
}

// absorbProgress is the feed's progress count for absorb pacing (absorb.Holder.Pace): its
// upstream events and its streams that lived the brake's old age, both only ever counted up.
// A quiet watch's resumed stream that lived is progress: the 410 that ends the stream after it
// is not the resume's answer to the list's resourceVersion.
func (f *feed) absorbProgress() uint64 { return f.events + f.brake.old }

// observeState updates the feed's state with an event delivered; it says so once when the
// state is dropped.
func (f *feed) observeState(ev *stream.Event) {
	dropped := f.abs.Observe(ev)
	if dropped == "" {
		return
	}
	if dropped == absorb.OverBudget {
		f.h.deps.Metrics.AbsorbStatesDropped.Inc()
	}
	f.log.Info("the watch's state is dropped: a 410 at its resume point will reach its client",
		zap.String("path", f.client.URL.Path), zap.String("why", dropped), zap.Int64("perFeedBytes", f.h.stateBudget.PerFeed()),
		zap.Int64("totalBytes", f.h.stateBudget.Total()), zap.String("type", ev.Type), zap.String("rv", ev.RV))
}

// absorbGone answers a 410 at the resume point (st, as the upstream said it) when the feed can:
// true when its subscribers got the difference and the resume point is the list's. False
// and end.end set: the client's stream ended while it was written to. False alone: the 410 is
// the client's (logged, with why).
func (f *feed) absorbGone(st *metav1.Status) (bool, attemptEnd) {
	if f.h.cfg.DisableAbsorb {
		return false, attemptEnd{}
	}
	m := f.h.deps.Metrics
	R, ok := f.resumePoint()
	why := f.abs.Unable(ok && !f.sub.InInitialPhase())
	msg := ""
	if st != nil {
		msg = st.Message
	}
	if why != "" {
		m.GoneAbsorbed.WithLabelValues(why).Inc()
		f.log.Info("upstream said the watch's resume point is gone, and the watch cannot absorb it",
			zap.String("path", f.client.URL.Path), zap.String("fromRV", f.sub.LastDelivered()), zap.String("why", why), zap.String("message", msg))
		return false, attemptEnd{}
	}
	run, ok := f.abs.Pace(f.absorbProgress(), f.h.clk.Now(), f.h.cfg.ResumeTimeout)
	if !ok {
		m.GoneAbsorbed.WithLabelValues(absorb.ListFailed).Inc()
		f.log.Info("upstream answered 410 again after every absorb; the client relists",
			zap.String("path", f.client.URL.Path), zap.String("fromRV", f.sub.LastDelivered()), zap.Int("absorbs", run-1))
		return false, attemptEnd{}
	}
	shared, _ := f.sub.(absorbingSink)
	l, err := f.list(run > 1, "")
	if err != nil {
		if f.ctx.Err() != nil {
			return false, attemptEnd{end: f.endFromContext()}
		}
		why := absorb.ListFailed
		if errors.Is(err, absorb.ErrListBudget) {
			why = absorb.OverBudget
		}
		m.GoneAbsorbed.WithLabelValues(why).Inc()
		f.log.Info("upstream said the watch's resume point is gone, and the list to absorb it failed; the client relists",
			zap.String("path", f.client.URL.Path), zap.String("fromRV", f.sub.LastDelivered()), zap.String("message", msg), zap.Error(err))
		return false, attemptEnd{}
	}
	defer l.Free()
	evs, err := f.abs.Diff(f.format, l, R, f.h.cfg.MaxFrameSize)
	if err != nil {
		m.GoneAbsorbed.WithLabelValues(absorb.ListFailed).Inc()
		f.log.Warn("the list taken to absorb a 410 does not agree with the watch's state; the client relists",
			zap.String("path", f.client.URL.Path), zap.Uint64("fromRV", R), zap.Uint64("listRV", l.RV()), zap.Error(err))
		return false, attemptEnd{}
	}
	if shared != nil {
		// A shared feed's subscribers get a list's objects: from here no one joins (a joiner
		// would get them unreviewed, and the ring is made sound across the absorb), and each
		// member not allowed to list gets the 410 alone (share_state.go). Joins stay open
		// while the list is taken, which may take as long as an apiserver's restart.
		shared.absorbBegin()
		shared.absorbAdmit(st)
	}
	counts := map[string]int{}
	for _, se := range evs {
		d := f.sub.decide
		if se.Gone {
			d = f.sub.decideGone
		}
		if werr := f.pass(se.Ev, d(se.Ev)); werr != nil {
			return false, f.clientEnd()
		}
		if se.Ev.Type != stream.Bookmark {
			counts[se.Ev.Type]++
			m.AbsorbEvents.WithLabelValues(se.Ev.Type).Inc()
		}
	}
	if shared != nil {
		shared.absorbEnd(l.RV())
	}
	f.lease.Progress(l.RV(), 0)
	_ = f.sub.flush()
	if e, _ := f.sub.broken(); e != endNone {
		return false, f.clientEnd()
	}
	f.abs.Absorbed(f.absorbProgress(), f.h.clk.Now())
	m.GoneAbsorbed.WithLabelValues(absorb.Absorbed).Inc()
	f.h.note("absorb", f.backend, f.client.URL.Path, fmt.Sprintf("from resourceVersion %d to %d: %d deleted, %d added, %d modified",
		R, l.RV(), counts[stream.Deleted], counts[stream.Added], counts[stream.Modified]))
	f.log.Info("absorbed a 410 at the watch's resume point: its client got the difference with a fresh list, and the watch goes on from the list's resourceVersion",
		zap.String("path", f.client.URL.Path), zap.Uint64("fromRV", R), zap.Uint64("listRV", l.RV()), zap.String("message", msg),
		zap.Int("deleted", counts[stream.Deleted]), zap.Int("added", counts[stream.Added]), zap.Int("modified", counts[stream.Modified]),
		zap.Int("objects", l.Len()), zap.Int("pages", l.Pages()))
	return true, attemptEnd{}
}

// list reads the feed's scope whole (absorb.List), page by page (limit and continue), a
// consistent read (resourceVersion unset: served at etcd's current revision, which is at or
// past every resourceVersion the watch delivered), with the feed's own credentials, every page
// through the Attempter like every other upstream request: retried with backoff, the first page
// after the absorb backoff's next step when paced (a run of absorbs), all within the resume
// timeout. It holds what it read against the states' budget.
//
// With exact (not ""), it is completeByList's: the list at exactly that resourceVersion
// (resourceVersionMatch=Exact, served from etcd until compacted), within
// absorb.CompleteListTimeout, without waiting for a backend.
func (f *feed) list(paced bool, exact string) (*absorb.Listed, error) {
	codec := f.listCodec()
	if codec == nil {
		return nil, fmt.Errorf("no list in format %s for Accept %q", f.format, f.client.Header.Get("Accept"))
	}
	deadline := f.h.clk.Now().Add(f.h.cfg.ResumeTimeout)
	if exact != "" {
		deadline = f.h.clk.Now().Add(absorb.CompleteListTimeout)
	}
	return absorb.List(codec, f.h.stateBudget, func(cont string, max int64) (*stream.ListPage, int64, error) {
		plan := upstream.Plan{Credentials: f.cred, Deadline: deadline, WaitForBackend: exact == ""}
		if cont == "" && exact == "" {
			plan.Backoff, plan.AfterFailure = f.abs.Backoff(), paced
		}
		return f.listPage(codec, cont, exact, plan, max)
	})
}

// listPage gets one page of the scope's list (cont: the previous page's continue token), at
// most max bytes of body.
func (f *feed) listPage(codec stream.ListCodec, cont, exact string, plan upstream.Plan, max int64) (*stream.ListPage, int64, error) {
	lq := url.Values{"limit": {strconv.Itoa(absorb.PageSize)}}
	for _, k := range []string{"labelSelector", "fieldSelector", "includeObject"} {
		if v := f.query.Get(k); v != "" {
			lq.Set(k, v)
		}
	}
	if cont != "" {
		lq.Set("continue", cont)
	}
	if exact != "" && cont == "" { // a continue token carries the list's resourceVersion
		lq.Set("resourceVersion", exact)
		lq.Set("resourceVersionMatch", "Exact")
	}
	lr := f.requestFrom(true, "")
	lr.URL = &url.URL{Path: strings.Replace(f.client.URL.Path, "/watch/", "/", 1), RawQuery: lq.Encode()}
	accept := codec.Accept()
	if stream.IsTable(codec) {
		// The client's own: the apiserver answers it the Table it answers the client's watch
		// (its Content-Type says only JSON; the codec refuses a body that is no Table).
		accept = f.client.Header.Get("Accept")
	}
	lr.Header.Set("Accept", accept)
	lr.Header.Set("User-Agent", absorbAgent+" (for "+f.client.UserAgent()+")")
	at, err := f.h.deps.Attempts.Do(f.ctx, lr, plan)
	if err != nil {
		return nil, 0, err
	}
	defer at.Cancel(nil)
	resp := at.Resp
	if !f.readsAs(resp) {
		drain(resp)
		err := fmt.Errorf("%s answered the list %s (%s)", at.Backend, resp.Status, resp.Header.Get("Content-Type"))
		if resp.StatusCode == http.StatusGone {
			err = fmt.Errorf("%w: %w", absorb.ErrListGone, err)
		}
		return nil, 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
	if err != nil {
		return nil, 0, fmt.Errorf("reading the list from %s: %w", at.Backend, err)
	}
	if int64(len(body)) > max {
		return nil, 0, absorb.ErrListBudget
	}
	page, err := codec.DecodeList(body)
	if err != nil {
		return nil, 0, fmt.Errorf("the list from %s: %w", at.Backend, err)
	}
	return page, int64(len(body)), nil
}

// CompletingListResults lists watchsan_watch_absorb_completing_lists_total's results.
var CompletingListResults = absorb.CompletingListResults

// completeByList makes the state of a private feed that begins at a client's resourceVersion
// C, and adopted none, complete at C (docs/design.md section 12): the scope's list at exactly
// C is its true state at C, which is what the client, correct at C, holds. A client's first
// watch follows its own list at C, seconds before: etcd still has C (it compacts about five
// minutes behind), and the list is one request of the client's own. When C is gone
// (compacted: an old re-watch) or the list fails or passes the budget, the feed keeps no state,
// as before. It is called before the feed's first read: nothing is delivered meanwhile.
func (f *feed) completeByList(key, c string) {
	l, err := f.list(false, c)
	result, err := f.abs.Complete(f.h.stateBudget, f.format, key, c, l, err)
	f.h.deps.Metrics.AbsorbCompletingLists.WithLabelValues(result).Inc()
	if result != absorb.CompleteDone {
		f.log.Debug("no complete state for the watch: a 410 at its resume point will reach its client",
			zap.String("path", f.client.URL.Path), zap.String("fromRV", c), zap.String("result", result), zap.Error(err))
	}
}

// stateKey is what a state is parked and adopted by, but for its resourceVersion: the watch's
// path in its list form (listPath), every parameter but the per-subscriber ones
// (perSubscriber: its resourceVersion, its timeoutSeconds, bookmarks, timeout), the
// initial-state ones (sendInitialEvents, resourceVersionMatch: the re-watch of a watch-list is
// a plain watch) and the ones that say list or watch and page (watch, limit, continue: a
// client's own list is parked under its watch's key, listtee.go), its Accept, and the
// principal the upstream takes it for (cred.Principal, a digest): a state is only ever handed
// to the same identity's watch of the same scope. A list's key and its watch's are made here,
// by one rule. query is r's, as parsed (params.query for a watch).
func stateKey(r *http.Request, query url.Values, cred upstream.Credentials) string {
	q := copyQuery(query)
	for _, k := range append(perSubscriber, "sendInitialEvents", "resourceVersionMatch", "watch", "limit", "continue") {
		q.Del(k)
	}
	return listPath(r.URL.Path) + "?" + q.Encode() + "\x00accept=" + r.Header.Get("Accept") + "\x00as=" + cred.Principal()
}

// listPath is path with the "watch" segment of a watch by path (/api/v1/watch/namespaces/d/pods,
// /apis/apps/v1/watch/deployments) taken out: the path of the same scope's list; any other path
// as it is (a namespace named "watch" is not that segment).
func listPath(path string) string {
	seg := strings.SplitN(path, "/", 6)
	at := 0
	switch {
	case len(seg) > 3 && seg[1] == "api":
		at = 3
	case len(seg) > 4 && seg[1] == "apis":
		at = 4
	}
	if at == 0 || seg[at] != "watch" {
		return path
	}
	return strings.Join(seg[:at], "/") + path[len(strings.Join(seg[:at+1], "/")):]
}

package watch

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/upstream"
)

// Absorbing a 410 at the resume point (docs/design.md section 12). A feed whose
// state is complete (state.go) answers an expired resume point with a list of its scope and
// the difference between it and its state, sent to its subscribers through the normal
// delivery path: first a DELETED for every object gone (or replaced: another uid), carrying
// its last known state at exactly the last delivered resourceVersion R; then ADDED and
// MODIFIED in ascending resourceVersion, all in (R, L] for the list's L; then a BOOKMARK at L.
// The feed then watches on from L. Everything is read, within the budget, before anything is
// written: a list that fails leaves the subscribers as they were, and they get the 410.

// The values of watchsan_watch_gone_absorbed_total's outcome label (AbsorbOutcomes).
const (
	// absorbAbsorbed: the subscribers got the difference; no 410 reached them.
	absorbAbsorbed = "absorbed"
	// absorbNotComplete: the feed holds no complete state: its upstream watch began at a
	// client's resourceVersion (not with the initial state), or delivered an object it could
	// not key or compare.
	absorbNotComplete = "not-complete"
	// absorbOverBudget: the state, or the list, would pass --watch-absorb-state-bytes or
	// --watch-absorb-total-bytes; the state was dropped.
	absorbOverBudget = "over-budget"
	// absorbFormat: the feed's objects are not whole objects (a Table, metadata only: Accept
	// with "as="), or its format is not one absorbing reads (stream.ListCodecFor: JSON, protobuf
	// and CBOR are).
	absorbFormat = "format"
	// absorbListFailed: the list did not succeed in time (backed off within the resume
	// timeout), was malformed, or did not agree with the state.
	absorbListFailed = "list-failed"
)

// AbsorbOutcomes lists watchsan_watch_gone_absorbed_total's outcomes (to initialise series).
var AbsorbOutcomes = []string{absorbAbsorbed, absorbNotComplete, absorbOverBudget, absorbFormat, absorbListFailed, absorbListDenied}

// absorbAgent is the User-Agent of an absorb's list, before the client's own.
const absorbAgent = "watchsan-absorb"

// absorbPageSize is the limit of each page of an absorb's list, client-go's reflector's.
const absorbPageSize = 500

// absorbMaxRun bounds the absorbs in a row without an upstream event between them (an
// upstream that answers 410 to every list's resourceVersion): each after the first waits the
// absorb backoff, and the one after these sends the 410.
const absorbMaxRun = 8

// completeFromStart says whether a watch's first upstream request begins with the initial
// state (every object alive as an ADDED first): resourceVersion "" or "0" unless
// sendInitialEvents=false, or a watch-list (sendInitialEvents=true).
func completeFromStart(r *http.Request, p params) bool {
	q := r.URL.Query()
	if q.Has("sendInitialEvents") {
		return p.sendInitialEvents
	}
	return p.rv == "" || p.rv == "0"
}

// stateFor is the state a new private feed keeps, or nil and why not (an AbsorbOutcomes
// value; "" when absorbing is off).
func (h *Handler) stateFor(r *http.Request, p params, format stream.Format) (*feedState, string) {
	switch {
	case h.cfg.DisableAbsorb:
		return nil, ""
	case stream.ListCodecFor(format) == nil || strings.Contains(r.Header.Get("Accept"), "as="):
		return nil, absorbFormat
	case !completeFromStart(r, p):
		return nil, absorbNotComplete
	}
	return newFeedState(h.stateBudget, format), ""
}

// observeState updates the feed's state with an event delivered; it says so once when the
// state is dropped.
func (f *feed) observeState(ev *stream.Event) {
	s := f.state
	if s == nil || s.dropped != "" || s.observe(ev) {
		return
	}
	if s.dropped == absorbOverBudget {
		f.h.deps.Metrics.AbsorbStatesDropped.Inc()
	}
	f.log.Info("the watch's state is dropped: a 410 at its resume point will reach its client",
		zap.String("path", f.client.URL.Path), zap.String("why", s.dropped), zap.Int64("perFeedBytes", s.budget.perFeed),
		zap.Int64("totalBytes", s.budget.total), zap.String("type", ev.Type), zap.String("rv", ev.RV))
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
	why := f.noState
	switch {
	case f.state == nil && why == "":
		why = absorbNotComplete
	case f.state != nil && f.state.dropped != "":
		why = f.state.dropped
	}
	R, ok := stream.ParseRV(f.sub.LastDelivered())
	if why == "" && (!ok || f.sub.InInitialPhase()) {
		why = absorbNotComplete
	}
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
	// A run of absorbs with no upstream event between them is paced by its own backoff and
	// bounded: an upstream that answers 410 to every list's resourceVersion costs a list per
	// backoff step, then its client relists as without absorbing.
	pc := f.pacing
	if pc == nil {
		pc = &absorbPacing{backoff: upstream.ResumeBackoff}
		f.pacing = pc
	}
	if f.events != pc.events || f.h.clk.Since(pc.at) > f.h.cfg.ResumeTimeout {
		pc.backoff.Reset()
		pc.run = 0
	}
	pc.run++
	if pc.run > absorbMaxRun {
		m.GoneAbsorbed.WithLabelValues(absorbListFailed).Inc()
		f.log.Info("upstream answered 410 again after every absorb; the client relists",
			zap.String("path", f.client.URL.Path), zap.String("fromRV", f.sub.LastDelivered()), zap.Int("absorbs", pc.run-1))
		return false, attemptEnd{}
	}
	shared, _ := f.sub.(*sharedFeed)
	l, err := f.list(pc.run > 1, "")
	if err != nil {
		if f.ctx.Err() != nil {
			return false, attemptEnd{end: f.endFromContext()}
		}
		why := absorbListFailed
		if errors.Is(err, errListBudget) {
			why = absorbOverBudget
		}
		m.GoneAbsorbed.WithLabelValues(why).Inc()
		f.log.Info("upstream said the watch's resume point is gone, and the list to absorb it failed; the client relists",
			zap.String("path", f.client.URL.Path), zap.String("fromRV", f.sub.LastDelivered()), zap.String("message", msg), zap.Error(err))
		return false, attemptEnd{}
	}
	defer l.free()
	evs, err := f.diff(l, R)
	if err != nil {
		m.GoneAbsorbed.WithLabelValues(absorbListFailed).Inc()
		f.log.Warn("the list taken to absorb a 410 does not agree with the watch's state; the client relists",
			zap.String("path", f.client.URL.Path), zap.Uint64("fromRV", R), zap.Uint64("listRV", l.rv), zap.Error(err))
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
		if se.gone {
			d = f.sub.decideGone
		}
		if werr := f.pass(se.ev, d(se.ev)); werr != nil {
			return false, f.clientEnd()
		}
		if se.ev.Type != stream.Bookmark {
			counts[se.ev.Type]++
			m.AbsorbEvents.WithLabelValues(se.ev.Type).Inc()
		}
	}
	if shared != nil {
		shared.absorbEnd(l.rv)
	}
	f.lease.Progress(l.rv, 0)
	_ = f.sub.flush()
	if e, _ := f.sub.broken(); e != endNone {
		return false, f.clientEnd()
	}
	pc.events, pc.at = f.events, f.h.clk.Now()
	m.GoneAbsorbed.WithLabelValues(absorbAbsorbed).Inc()
	f.h.note("absorb", f.backend, f.client.URL.Path, fmt.Sprintf("from resourceVersion %d to %d: %d deleted, %d added, %d modified",
		R, l.rv, counts[stream.Deleted], counts[stream.Added], counts[stream.Modified]))
	f.log.Info("absorbed a 410 at the watch's resume point: its client got the difference with a fresh list, and the watch goes on from the list's resourceVersion",
		zap.String("path", f.client.URL.Path), zap.Uint64("fromRV", R), zap.Uint64("listRV", l.rv), zap.String("message", msg),
		zap.Int("deleted", counts[stream.Deleted]), zap.Int("added", counts[stream.Added]), zap.Int("modified", counts[stream.Modified]),
		zap.Int("objects", len(l.items)), zap.Int("pages", l.pages))
	return true, attemptEnd{}
}

// absorbPacing paces a run of absorbs with no upstream event between them: run of them, the
// last at at, when the feed had handed its sink events upstream events; each list after the
// run's first waits backoff's next step.
type absorbPacing struct {
	backoff upstream.Backoff
	run     int
	events  uint64
	at      time.Time
}

// errListGone: the list's resourceVersion is gone (compacted).
var errListGone = errors.New("the list's resourceVersion is gone")

// errListBudget: the list would pass the state's budget.
var errListBudget = errors.New("the list is larger than the watch's state budget")

// listed is a list of the feed's scope, read whole.
type listed struct {
	codec            stream.ListCodec // the feed's format's
	budget           *stateBudget
	held             int64 // bytes taken from the budget while it is held
	kind, apiVersion string
	rv               uint64
	items            map[string]*listItem // by namespace/name
	pages            int
}

type listItem struct {
	uid string
	rv  uint64
	obj []byte // the item as a watch event's object (stream.ListCodec.Item)
}

func (l *listed) free() { l.budget.give(l.held) }

// list reads the feed's scope whole, page by page (limit and continue), a consistent read
// (resourceVersion unset: served at etcd's current revision, which is at or past every
// resourceVersion the watch delivered), with the feed's own credentials, every page through
// the Attempter like every other upstream request: retried with backoff, the first page after
// the absorb backoff's next step when paced (a run of absorbs), all within the resume
// timeout. It holds what it read against the state's budget.
//
// With exact (not ""), it is completeByList's: the list at exactly that resourceVersion
// (resourceVersionMatch=Exact, served from etcd until compacted), within completeListTimeout,
// without waiting for a backend.
func (f *feed) list(paced bool, exact string) (*listed, error) {
	b := f.state.budget
	l := &listed{codec: stream.ListCodecFor(f.format), budget: b, items: map[string]*listItem{}}
	if l.codec == nil {
		return nil, fmt.Errorf("no list in format %s", f.format)
	}
	deadline := f.h.clk.Now().Add(f.h.cfg.ResumeTimeout)
	if exact != "" {
		deadline = f.h.clk.Now().Add(completeListTimeout)
	}
	cont := ""
	for {
		plan := upstream.Plan{Credentials: f.cred, Deadline: deadline, WaitForBackend: exact == ""}
		if l.pages == 0 && exact == "" {
			plan.Backoff, plan.AfterFailure = &f.pacing.backoff, paced
		}
		page, n, err := f.listPage(l.codec, cont, exact, plan, b.perFeed-l.held)
		if err != nil {
			l.free()
			return nil, err
		}
		cost := n + int64(len(page.Items))*stateOverhead
		if l.held+cost > b.perFeed || !b.take(cost) {
			l.free()
			return nil, errListBudget
		}
		l.held += cost
		l.pages++
		if l.pages == 1 {
			l.kind, l.apiVersion = strings.TrimSuffix(page.Kind, "List"), page.APIVersion
			rv, ok := stream.ParseRV(page.ResourceVersion)
			if !ok || l.kind == "" || l.apiVersion == "" {
				l.free()
				return nil, fmt.Errorf("the list's kind %q, apiVersion %q or resourceVersion %q is not one watchsan reads", page.Kind, page.APIVersion, page.ResourceVersion)
			}
			l.rv = rv
		}
		for _, raw := range page.Items {
			key, it, err := l.codec.Item(l.kind, l.apiVersion, raw)
			if err != nil {
				l.free()
				return nil, err
			}
			l.items[key] = &listItem{uid: it.UID, rv: it.RV, obj: it.Object}
		}
		cont = page.Continue
		if cont == "" {
			return l, nil
		}
	}
}

// listPage gets one page of the scope's list (cont: the previous page's continue token), at
// most max bytes of body.
func (f *feed) listPage(codec stream.ListCodec, cont, exact string, plan upstream.Plan, max int64) (*stream.ListPage, int64, error) {
	q := f.client.URL.Query()
	lq := url.Values{"limit": {strconv.Itoa(absorbPageSize)}}
	for _, k := range []string{"labelSelector", "fieldSelector"} {
		if v := q.Get(k); v != "" {
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
	lr.Header.Set("Accept", codec.Accept())
	lr.Header.Set("User-Agent", absorbAgent+" (for "+f.client.UserAgent()+")")
	at, err := f.h.deps.Attempts.Do(f.ctx, lr, plan)
	if err != nil {
		return nil, 0, err
	}
	defer at.Cancel(nil)
	resp := at.Resp
	if format, ok := stream.FormatOf(resp.Header.Get("Content-Type")); resp.StatusCode != http.StatusOK || !ok || format != f.format || !identity(resp.Header) {
		drain(resp)
		err := fmt.Errorf("%s answered the list %s (%s)", at.Backend, resp.Status, resp.Header.Get("Content-Type"))
		if resp.StatusCode == http.StatusGone {
			err = fmt.Errorf("%w: %w", errListGone, err)
		}
		return nil, 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
	if err != nil {
		return nil, 0, fmt.Errorf("reading the list from %s: %w", at.Backend, err)
	}
	if int64(len(body)) > max {
		return nil, 0, errListBudget
	}
	page, err := codec.DecodeList(body)
	if err != nil {
		return nil, 0, fmt.Errorf("the list from %s: %w", at.Backend, err)
	}
	return page, int64(len(body)), nil
}

// synthetic is one event of an absorb; gone: a DELETED at the last delivered RV.
type synthetic struct {
	ev   *stream.Event
	gone bool
}

// diff is the events that take the state to the list l, in the order they are sent, the
// bookmark at l's resourceVersion last; R is the last delivered resourceVersion. An error: the
// list does not agree with a complete state at R (an object unchanged since at or before R
// that the state does not hold as it is), and nothing may be sent.
func (f *feed) diff(l *listed, R uint64) ([]synthetic, error) {
	if l.rv < R {
		return nil, fmt.Errorf("the list's resourceVersion %d is before the last delivered %d", l.rv, R)
	}
	s := f.state
	var out []synthetic
	var gone []string
	for key, o := range s.objs {
		if it := l.items[key]; it == nil || it.uid != o.uid {
			gone = append(gone, key)
		}
	}
	sort.Strings(gone)
	rv := strconv.FormatUint(R, 10)
	for _, key := range gone {
		obj, err := l.codec.ObjectOf(s.objs[key].frame)
		if err != nil {
			return nil, fmt.Errorf("the state's %s: %w", key, err)
		}
		ev, err := f.synthesize(l.codec, stream.Deleted, obj, rv)
		if err != nil {
			return nil, fmt.Errorf("a DELETED for %s: %w", key, err)
		}
		out = append(out, synthetic{ev: ev, gone: true})
	}
	type change struct {
		typ string
		it  *listItem
	}
	var changes []change
	for key, it := range l.items {
		o := s.objs[key]
		typ := stream.Added
		switch {
		case o != nil && o.uid == it.uid && o.rv == it.rv:
			continue // unchanged
		case o != nil && o.uid == it.uid:
			typ = stream.Modified
		}
		if it.rv <= R || it.rv > l.rv {
			return nil, fmt.Errorf("%s (%s) at resourceVersion %d, outside (%d, %d]", key, typ, it.rv, R, l.rv)
		}
		changes = append(changes, change{typ, it})
	}
	sort.Slice(changes, func(i, j int) bool { return changes[i].it.rv < changes[j].it.rv })
	for _, c := range changes {
		ev, err := f.synthesize(l.codec, c.typ, c.it.obj, "")
		if err != nil {
			return nil, fmt.Errorf("an %s: %w", c.typ, err)
		}
		out = append(out, synthetic{ev: ev})
	}
	ev, err := f.synthesize(l.codec, stream.Bookmark, l.codec.Bookmark(l.kind, l.apiVersion, strconv.FormatUint(l.rv, 10)), "")
	if err != nil {
		return nil, fmt.Errorf("the bookmark: %w", err)
	}
	return append(out, synthetic{ev: ev}), nil
}

// synthesize makes a watch event of type typ with object obj in the feed's format (codec's),
// as the feed's Reader reads one (so the policy, the writers and the ring take it as any
// other), its resourceVersion set to rv when rv is not "" (stream.Writer's in-place rewrite,
// as a delete's rewrite is made).
func (f *feed) synthesize(codec stream.ListCodec, typ string, obj []byte, rv string) (*stream.Event, error) {
	ev, err := readOne(f.format, codec.Frame(typ, obj), f.h.cfg.MaxFrameSize)
	if err != nil || rv == "" || ev.RV == rv {
		return ev, err
	}
	var buf bytes.Buffer
	if err := stream.NewWriter(f.format, &buf).WriteWithRV(ev, rv); err != nil {
		return nil, err
	}
	return readOne(f.format, buf.Bytes(), f.h.cfg.MaxFrameSize)
}

// readOne reads the one event in frame, in format.
func readOne(format stream.Format, frame []byte, maxFrame int) (*stream.Event, error) {
	ev, err := stream.NewReader(format, bytes.NewReader(frame), maxFrame).Next()
	if err != nil {
		return nil, err
	}
	return ev.Clone(), nil
}

// completeListTimeout bounds a completing list (completeByList): the client's stream waits for
// it before its first event.
const completeListTimeout = 10 * time.Second

// The values of watchsan_watch_absorb_completing_lists_total's result label.
const (
	completeDone       = "complete"
	completeGone       = "gone"
	completeOverBudget = "over-budget"
	completeFailed     = "failed"
)

// CompletingListResults lists watchsan_watch_absorb_completing_lists_total's results.
var CompletingListResults = []string{completeDone, completeGone, completeOverBudget, completeFailed}

// completeByList makes the state of a private feed that begins at a client's resourceVersion
// C, and adopted none, complete at C (docs/design.md section 12): the scope's list at exactly
// C is its true state at C, which is what the client, correct at C, holds. A client's first
// watch follows its own list at C, seconds before: etcd still has C (it compacts about five
// minutes behind), and the list is one request of the client's own. When C is gone
// (compacted: an old re-watch) or the list fails or passes the budget, the feed keeps no state,
// as before. It is called before the feed's first read: nothing is delivered meanwhile.
func (f *feed) completeByList(c string) {
	f.state = newFeedState(f.h.stateBudget, f.format)
	m := f.h.deps.Metrics
	fail := func(result string, err error) {
		m.AbsorbCompletingLists.WithLabelValues(result).Inc()
		f.log.Debug("no complete state for the watch: a 410 at its resume point will reach its client",
			zap.String("path", f.client.URL.Path), zap.String("fromRV", c), zap.String("result", result), zap.Error(err))
		f.state.free()
		f.state, f.noState = nil, absorbNotComplete
	}
	l, err := f.list(false, c)
	if err != nil {
		switch {
		case errors.Is(err, errListGone):
			fail(completeGone, err)
		case errors.Is(err, errListBudget):
			fail(completeOverBudget, err)
		default:
			fail(completeFailed, err)
		}
		return
	}
	defer l.free()
	if want, _ := stream.ParseRV(c); l.rv != want {
		fail(completeFailed, fmt.Errorf("the exact list answered at %d", l.rv))
		return
	}
	s := f.state
	for key, it := range l.items {
		frame := l.codec.Frame(stream.Added, it.obj)
		if !s.put(key, &stateObj{uid: it.uid, rv: it.rv, frame: frame}) {
			fail(completeOverBudget, errListBudget)
			return
		}
	}
	f.noState = ""
	m.AbsorbCompletingLists.WithLabelValues(completeDone).Inc()
}

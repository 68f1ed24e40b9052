package watch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/budget"
	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/upstream"
)

// Moves are make-before-break (docs/design.md section 10.1): the Pool asks a watch to move
// (upstream.Lease.Asked, upstream.Plan.MakeBeforeBreak), and the feed, on a goroutine of the
// attempt's own (awaitMove), opens the target from its resume point while the attempt goes on
// feeding the client; the feed's loop then switches to the target (feed.next). Only once the target has accepted the resume
// point (it answered 200 and its first frame is no ERROR, or it stayed silent for
// acceptSilence after its headers: the watch cache sends a too-old resume point's ERROR at
// once, section 10.1) does the current attempt end (Lease.Cut) and the feed switch to the
// target; what the old attempt delivered meanwhile comes again from the target and is
// skipped. A target that refuses (a 410 among them: the Pool learns its floor, section 10.2)
// is left, the next is tried, and when none accepts, the watch stays where it is
// (Lease.MoveFailed). A watch whose resume point no target can serve first asks its own
// backend for a fresher one (freshPoint, section 10.3).

const (
	// acceptSilence is how long a target's silence after its headers counts as acceptance.
	acceptSilence = time.Second
	// acceptTimeout bounds the wait for a target's headers (a plain watch from a resume point
	// beyond a lagging cache waits there).
	acceptTimeout = 10 * time.Second
	// moveHold is how long a watch whose move found no target that accepts it stays put
	// before the Pool may ask again.
	moveHold = 5 * time.Second
	// maxMoveTargets bounds the targets one move tries.
	maxMoveTargets = 3
	// freshTimeout bounds the fresh-resume-point probe; freshWatchSeconds is its watch's
	// timeoutSeconds: the apiserver sends a bookmark 2 s before a watch's deadline (section 2).
	freshTimeout      = 6 * time.Second
	freshWatchSeconds = "3"
	// freshAgent starts the User-Agent of the fresh-resume-point probe's list and watch,
	// followed by the client's in parentheses: they go with the client's credentials, and an
	// audit log tells them from the client's own lists and watches by it.
	freshAgent = "watchsan-fresh-resume-point"
)

var (
	errAcceptTimeout = errors.New("the move's target did not answer in time")
	errNoTarget      = errors.New("no backend can serve the watch's resume point")
)

// source is one attempt as the feed receives it: its reader, and for a move's target the frame
// read ahead while it was being accepted.
type source struct {
	at   upstream.Attempt
	slot *moveSlot // where a move of this attempt leaves its target
	body *attemptBody
	rd   *stream.Reader
	// peek, when not nil, delivers the first frame (read by accept), then is done with.
	peek chan peeked
	// dedupe: a move's target, started at or below the resume point the feed has when it
	// switches; prefix, a bookmark from freshPoint to deliver first (nil: none).
	dedupe bool
	prefix *stream.Event
	reason upstream.MoveReason

	// Once the feed receives it (receive): the watchdog's stop, when the upstream went silent
	// once the watchdog found it stalled, the feed's progress count when it began, the
	// resume point a move's target skips up to, and how it ended.
	stopWatchdog func()
	silentSince  atomic.Int64
	start        uint64
	skip         uint64
	end          attemptEnd
}

type peeked struct {
	ev  *stream.Event
	err error
}

func (src *source) next() (*stream.Event, error) {
	if src.peek != nil {
		p := <-src.peek
		src.peek = nil
		return p.ev, p.err
	}
	return src.rd.Next()
}

// close lets the reader of an attempt that ended go (its buffers, what it holds of the memory
// budget), once its attempt is cancelled: a first frame still being peeked at ends with the
// attempt's body.
func (src *source) close() {
	if src.peek != nil {
		<-src.peek
		src.peek = nil
	}
	src.rd.Close()
}

// source wraps an attempt for receive.
func (f *feed) source(at upstream.Attempt) *source {
	body := &attemptBody{r: at.Resp.Body, sink: f.sub, lease: at.Lease, clk: f.h.clk}
	rd := stream.NewReader(f.format, body, f.h.cfg.MaxFrameSize)
	if f.mem != nil {
		rd.SetBudget(f.mem.Of(budget.Frames))
	}
	return &source{at: at, slot: &moveSlot{}, body: body, rd: rd}
}

// moveSlot is where a move leaves its accepted target for the feed, once per attempt.
type moveSlot struct {
	mu     sync.Mutex
	closed bool
	next   *source
}

// put leaves src for the feed; false when the attempt has ended already (src is not taken).
func (m *moveSlot) put(src *source) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.next != nil {
		return false
	}
	m.next = src
	return true
}

// close ends the slot with its attempt and returns the target left in it, if any.
func (m *moveSlot) close() *source {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	next := m.next
	m.next = nil
	return next
}

// awaitMove carries out the Pool's request to move the attempt src, if one comes while the
// attempt lasts (upstream.Lease.Asked): the feed receives it on this goroutine, one per
// attempt, started as the feed begins to receive the attempt, and ended with the attempt.
func (f *feed) awaitMove(src *source) {
	select {
	case r := <-src.at.Lease.Asked():
		f.tryMove(src.slot, src.at.Lease, r)
	case <-src.at.Resp.Request.Context().Done():
	}
}

// tryMove moves the watch of lease l for r: it opens a target, leaves it in slot for the
// feed's loop (feed.next) and ends the attempt (Lease.Cut), or tells the lease it stays.
func (f *feed) tryMove(slot *moveSlot, l *upstream.Lease, r upstream.MoveReason) {
	from := l.Pos()
	if !l.Movable() || from == 0 {
		// Not movable unnoticed (initial phase, an opaque resume point): only the Pool's
		// drains of unhealthy or removed backends ask this, and end it as before.
		l.Cut(r)
		return
	}
	src, err := f.moveTarget(l, r, from, nil)
	if errors.Is(err, errNoTarget) {
		if prefix, fresh := f.freshPoint(l, from); prefix != nil {
			src, err = f.moveTarget(l, r, fresh, prefix)
		}
	}
	if err != nil {
		l.MoveFailed(moveHold)
		f.h.deps.Metrics.WatchMovesFailed.WithLabelValues(r.String()).Inc()
		f.log.Debug("watch not moved: no target accepted its resume point; it stays",
			zap.String("path", f.client.URL.Path), zap.Stringer("upstream", l.Backend()), zap.Stringer("reason", r),
			zap.Uint64("fromRV", from), zap.Error(err))
		return
	}
	src.reason = r
	if !slot.put(src) {
		src.at.Cancel(nil)
		return
	}
	l.Cut(r)
}

// moveTarget opens the watch from from on the first of the lease's move targets that accepts
// it. errNoTarget: none can serve from (so a fresher resume point may help).
func (f *feed) moveTarget(l *upstream.Lease, r upstream.MoveReason, from uint64, prefix *stream.Event) (*source, error) {
	targets, blocked := l.MoveTargets(r, f.groupResource, from)
	var errs []error
	for i, t := range targets {
		if i == maxMoveTargets {
			break
		}
		src, err := f.openOn(t, from)
		if err == nil {
			src.dedupe, src.prefix = true, prefix
			return src, nil
		}
		if !t.CanServe(f.groupResource, from) {
			blocked = true
		}
		errs = append(errs, fmt.Errorf("%s: %w", t, err))
	}
	if blocked {
		errs = append(errs, errNoTarget)
	}
	if len(errs) == 0 {
		return nil, errors.New("no other backend to move to")
	}
	return nil, errors.Join(errs...)
}

// openOn opens the watch from from on t and waits until t has accepted it.
func (f *feed) openOn(t *upstream.Backend, from uint64) (*source, error) {
	ctx, cancel := context.WithCancelCause(f.ctx)
	headers := f.h.clk.AfterFunc(acceptTimeout, func() { cancel(errAcceptTimeout) })
	plan := f.plan(from)
	plan.Target = t
	at, err := f.h.deps.Attempts.Do(ctx, f.requestFrom(false, fmt.Sprint(from)), plan)
	if err != nil {
		headers.Stop()
		cancel(nil)
		return nil, err
	}
	src := f.source(at)
	inner := at.Cancel
	src.at.Cancel = func(cause error) { inner(cause); cancel(cause) }
	fail := func(err error) (*source, error) {
		headers.Stop()
		src.at.Cancel(nil)
		return nil, err
	}
	resp := at.Resp
	if !f.readsAs(resp) {
		if resp.StatusCode == http.StatusGone {
			f.noteGone(t, readStatus(resp), from)
		} else {
			drain(resp)
		}
		return fail(errors.New("answered " + resp.Status))
	}
	if !headers.Stop() {
		return fail(context.Cause(ctx))
	}
	src.peek = make(chan peeked, 1)
	go func() {
		ev, err := src.rd.Next()
		src.peek <- peeked{ev, err}
	}()
	silence := f.h.clk.NewTimer(acceptSilence)
	defer silence.Stop()
	select {
	case p := <-src.peek:
		if p.err != nil {
			return fail(p.err)
		}
		if p.ev.Type == stream.Error {
			st, _ := stream.DecodeStatus(f.format, p.ev)
			if st != nil && st.Code == http.StatusGone {
				f.noteGone(t, st, from)
			}
			return fail(errors.New("answered with an ERROR event"))
		}
		src.peek <- p // receive's first frame
	case <-silence.C():
	case <-ctx.Done():
		return fail(context.Cause(ctx))
	}
	return src, nil
}

// noteGone records a 410's floor on b (docs/design.md section 10.2): the cacher names it;
// without it, at least from is gone.
func (f *feed) noteGone(b *upstream.Backend, st *metav1.Status, from uint64) {
	floor := from + 1
	if st != nil {
		if n, ok := upstream.TooOldFloor(st.Message); ok {
			floor = n
		}
	}
	b.NoteTooOld(f.groupResource, floor)
}

// goneHere handles an attempt whose first frame is an ERROR: a 410 where another backend may
// still serve the resume point is no reason to end the client's stream (docs/design.md
// section 10.1): the floor is noted and the watch resumes elsewhere (true, src.end says so).
// False: the ERROR is the client's.
func (f *feed) goneHere(src *source, ev *stream.Event) bool {
	at := src.at
	st, err := stream.DecodeStatus(f.format, ev)
	if err != nil || st.Code != http.StatusGone || !f.movable() {
		return false
	}
	from, ok := f.resumePoint()
	if !ok {
		return false
	}
	f.noteGone(at.Backend, st, from)
	if !f.h.deps.Attempts.Servable(f.groupResource, from, at.Backend) {
		return false
	}
	f.log.Info("upstream cannot serve the watch's resume point; resuming it where it can be served",
		zap.String("path", f.client.URL.Path), zap.Stringer("upstream", at.Backend), zap.Uint64("fromRV", from), zap.String("message", st.Message))
	src.end = attemptEnd{resume: ResumeGoneHere, err: errors.New(st.Message)}
	return true
}

// switchTo makes a move's accepted target the feed's attempt.
func (f *feed) switchTo(src *source, end attemptEnd) {
	f.resumedOn(src.at.Backend, ResumeMoved)
	f.log.Info("moved upstream watch (make-before-break)", zap.String("path", f.client.URL.Path),
		zap.Stringer("movedBecause", src.reason), zap.Stringer("ended", end.resume), zap.String("lastRV", f.sub.LastDelivered()),
		zap.Stringer("upstream", src.at.Backend))
}

// freshPoint asks the lease's own backend for a resume point newer than from for this watch
// (docs/design.md section 10.3): a consistent list of the watch's scope (limit 1) makes its
// watch cache catch up with etcd, and a watch of the same scope from from, with a deadline
// 3 s away, gets a bookmark 2 s before it. A bookmark at B as its first frame says that the
// scope has no event in (from, B]: B is a resume point of the feed's watch too. It returns
// that bookmark and B, or nil when the backend offers none (or does not answer at all) (an event came first: the watch
// will deliver it, and can move after).
func (f *feed) freshPoint(l *upstream.Lease, from uint64) (*stream.Event, uint64) {
	b := l.Backend()
	if b.State() == upstream.Unhealthy { // it does not answer
		return nil, 0
	}
	ctx, cancel := context.WithCancelCause(f.ctx)
	defer cancel(nil)
	t := f.h.clk.AfterFunc(freshTimeout, func() { cancel(errAcceptTimeout) })
	defer t.Stop()

	list := url.Values{"limit": {"1"}}
	for _, k := range []string{"labelSelector", "fieldSelector"} {
		if v := f.query.Get(k); v != "" {
			list.Set(k, v)
		}
	}
	agent := freshAgent + " (for " + f.client.UserAgent() + ")"
	lr := f.requestFrom(true, "")
	lr.Header.Set("User-Agent", agent)
	lr.URL = &url.URL{Path: strings.Replace(f.client.URL.Path, "/watch/", "/", 1), RawQuery: list.Encode()}
	if at, err := f.h.deps.Attempts.Do(ctx, lr, upstream.Plan{Target: b, Credentials: f.cred}); err == nil {
		drain(at.Resp)
		at.Cancel(nil)
	}

	wq := f.queryFrom(false, fmt.Sprint(from))
	wq.Set("timeoutSeconds", freshWatchSeconds)
	wr := f.requestWith(wq)
	wr.Header.Set("User-Agent", agent)
	at, err := f.h.deps.Attempts.Do(ctx, wr, upstream.Plan{Target: b, Credentials: f.cred})
	if err != nil {
		return nil, 0
	}
	defer at.Cancel(nil)
	defer at.Resp.Body.Close()
	if !f.readsAs(at.Resp) {
		drain(at.Resp)
		return nil, 0
	}
	ev, err := stream.NewReader(f.format, at.Resp.Body, f.h.cfg.MaxFrameSize).Next()
	if err != nil || ev.Type != stream.Bookmark {
		return nil, 0
	}
	n := ev.RVInt
	if !ev.RVIsInt || n <= from {
		return nil, 0
	}
	f.h.deps.Metrics.WatchFreshPoints.Inc()
	return ev.Clone(), n
}

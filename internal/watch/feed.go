package watch

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/watchsan/watchsan/internal/absorb"
	"github.com/watchsan/watchsan/internal/budget"
	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/upstream"
)

// A watch is served by a feed and its subscriber. The feed is the upstream side: its attempts
// through the Attempter (the first, every resume, every move), the lease of the current one,
// the stall watchdog, how a break is classified and resumed, with the watch's one backoff
// (stepped only by the Attempter, docs/design.md section 5) and its brake on resumes after
// streams that end young (brake.go), on the Handler's clock. A
// subscriber (subscriber.go) is one client response: its policy (fix.Stream), its framing,
// its batched writes. A private feed has exactly one subscriber, the client whose request
// opened it; a shared feed's sink is a sharedFeed (share.go) that fans out to many. They meet
// only through sink.

// sink is what a feed delivers to. Its contract, which a fan-out to several subscribers
// must keep too:
//   - The feed calls its methods from one goroutine at a time, the one that receives (run,
//     receive), never concurrently; a move's goroutine calls none. A sink needs no lock for
//     them.
//   - For each upstream event, in the upstream's order, the feed calls decide, and unless the
//     decision is a Drop, write with that decision. Neither waits for the upstream.
//   - write and flush may block on a client, but each returns within that client's write
//     timeout (--watch-write-timeout): a client that does not take it makes them fail, and
//     broken says so from then on (EndSlowClient, or EndClientGone). Meanwhile the feed's
//     lease is busy (upstream.Lease.Busy): time spent on a client is never the upstream's
//     silence or lag.
//   - The feed calls flush before every read from the upstream that may wait, so nothing a
//     sink holds waits with it (docs/design.md section 5).
//   - InInitialPhase, LastDelivered and HasResumePoint are the resume point, as fix.Stream
//     keeps it: a feed resumes or moves from LastDelivered, and never in an initial phase.
//   - relist ends the stream with the ERROR 410 given; nothing is written after it.
//   - When the feed's context ends (the client left, its deadline, shutdown), the attempt's
//     read returns and receive with it; run returns within one write timeout. Nothing of the
//     sink's outlives the call that returns.
type sink interface {
	InInitialPhase() bool
	LastDelivered() string
	HasResumePoint() bool

	decide(ev *stream.Event) fix.Decision
	// decideGone is decide for a DELETED an absorb synthesized at the last delivered
	// resourceVersion (absorb.go, fix.Stream.DecideAbsorbedDelete).
	decideGone(ev *stream.Event) fix.Decision
	write(ev *stream.Event, d fix.Decision) error
	flush() error
	broken() (EndReason, error)
	gone() bool
	relist(st *metav1.Status)
}

// feed is the upstream side of one watch (see sink). Its goroutine is its caller's (run). The
// others it starts all have a way out: the watchdog is a timer stopped with its attempt; a
// move (awaitMove, the attempt's) ends with the attempt, or once its target is open, which ends
// with the feed's context or acceptTimeout, and
// its first-frame reader with its attempt, which a refusal or the feed's end cancels.
type feed struct {
	h      *Handler
	client *http.Request // the watch's request: every attempt's path and headers
	// query is the client's query as parsed once (params.query; a shared feed's, its
	// template's): every attempt's parameters, copied, never changed. Nil: none.
	query url.Values
	ctx   context.Context // ends with its client, its deadline, or shutdown (with a cause)
	cred  upstream.Credentials
	log   *watchLog
	sub   sink
	// format is the upstream's, the first answer's: every attempt must answer in it (readsAs).
	// Written by firstAnswer (feed.go) alone; zero until the first answer is read.
	format stream.Format

	// deadline is when the feed ends, its subscriber's timeoutSeconds or the max lifetime
	// (lifetime.go; zero: none, a shared feed's, which outlives its subscribers' deadlines);
	// timeout is that duration (negative: the client's, over: the first attempt goes as
	// sent), maxLifetime says it is the max lifetime's (the stream ends EndMaxLifetime at it;
	// false: EndDeadline, the client's).
	deadline    time.Time
	timeout     time.Duration
	maxLifetime bool

	// scope and groupResource tell the pool what the watch selects (lag detection) and of
	// which resource it delivers resourceVersions (the high-water mark).
	scope         string
	groupResource string

	// backend is the current attempt's (nil until the first answer); written in feed.go
	// alone: firstAnswer, and resumedOn for a resume or a move's switch.
	backend *upstream.Backend
	lease   *upstream.Lease // the current attempt's place on backend

	// backoff paces resumes that make no progress (the Attempter steps it). brokeAt is when the
	// upstream last broke after progress (for a stall: when it went silent), giveUpAt when
	// resuming without progress since then stops: ResumeTimeout after the break was found.
	backoff  upstream.Backoff
	brake    resumeBrake // paces resumes after streams that end young, even with progress (brake.go)
	brokeAt  time.Time
	giveUpAt time.Time
	resumes  int // resumes and moves so far (resumedOn, feed.go, alone)

	// stallResumedAt is when the attempt after a stall started; zero once its first delivery
	// has told whether the silent stream had hung (see judgeStall).
	stallResumedAt time.Time

	events   uint64 // upstream events handed to the sink
	progress uint64 // events it did not drop (object events and bookmarks, shown or not)

	// abs is the feed's hold on what its subscribers hold, kept to absorb a 410 at the resume
	// point, and the pacing of its absorbs (package absorb; the zero value: none kept,
	// absorbing off). Changed only through its methods, called in absorb.go alone.
	abs absorb.Holder

	// handoff, for a watch-list that may move onto a shared feed at its initial-events-end
	// bookmark (handoff.go); nil: none.
	handoff *handoff

	// cancel ends ctx; stopDeadline (nil: none) stops the timer that would, tracked says
	// the Handler's shutdown would (release), and unfollow (nil: a shared feed's, which has
	// no request) stops ending it with the request's context (Handler.Serve, once the watch
	// owns its connection and outlives its handler).
	cancel       context.CancelCauseFunc
	stopDeadline clock.Timer
	tracked      bool
	unfollow     func() bool
	// unrebalance stops Deps.Rebalance's hold on the client's stream (release); nil: none
	// (a shared feed's, or no Rebalance). Set by Handler.open once the stream began.
	unrebalance func()

	// mem is the feed's account of the memory budget, charged for the frames it reads
	// (source), closed by release; nil: nothing charged. Set at construction (Handler.open,
	// newSharedFeed), never written after.
	mem *budget.Account
}

// attemptEnd is how one upstream attempt ended.
type attemptEnd struct {
	end    EndReason    // not endNone: the client's stream ends now
	resume ResumeReason // otherwise: why the upstream broke
	err    error
	// progress: the attempt delivered an event or a bookmark.
	progress bool
	// silentSince, for a stall, is when the upstream last sent anything: the client's gap
	// began then, not when the stall was detected.
	silentSince time.Time
	// move, for ResumeMoved, is why the pool moved the watch.
	move upstream.MoveReason
}

// plan is the Attempter's plan for an attempt of this watch starting from resourceVersion from.
// Its moves are make-before-break (docs/design.md section 10.1): the Pool asks, and the feed
// carries the move out (awaitMove).
func (f *feed) plan(from uint64) upstream.Plan {
	return upstream.Plan{Watch: true, Scope: f.scope, Resource: f.groupResource, From: from, Credentials: f.cred,
		MakeBeforeBreak: true}
}

// resumePoint is the sink's resume point (LastDelivered) as an integer; false when it is none
// (opaque, or not yet any): the one place it is read as a number.
func (f *feed) resumePoint() (uint64, bool) { return stream.ParseRV(f.sub.LastDelivered()) }

// movable says whether the watch can resume elsewhere without its client noticing.
func (f *feed) movable() bool {
	return !f.h.cfg.DisableResume && !f.sub.InInitialPhase() && f.sub.HasResumePoint()
}

// run receives the first attempt and every resume until the client's stream ends. What it
// does between two attempts is next's: run's frame, and receive's, stay on the handler's
// stack while the watch waits for its upstream (Handler.Serve), so they are kept small.
func (f *feed) run(src *source) EndReason {
	for {
		f.receive(src)
		next, final := f.next(src)
		if next == nil {
			return final
		}
		src = next
	}
}

// next is what follows the attempt src that ended (src.end says how), as decideNext decides
// (next.go): the source of the next attempt (a move's accepted target, or a resume), or nil
// and how the client's stream ends.
func (f *feed) next(src *source) (*source, EndReason) {
	at, end := src.at, src.end
	moved := src.slot.close()
	v := decideNext(f.ending(end, moved != nil))
	if end.end == endNone {
		switch v.rule {
		case ruleNoResume:
			f.log.Info("upstream watch ended; ending the client's stream so it re-watches",
				zap.String("path", f.client.URL.Path), zap.Stringer("why", end.resume), zap.Bool("initialPhase", f.sub.InInitialPhase()), zap.Error(end.err))
		case ruleSwitch, ruleResume:
			if f.h.deps.OnBreak != nil {
				// Told while the attempt still holds its backend (a removed backend is not
				// forgotten before its watches have left it).
				f.h.deps.OnBreak(at.Backend, end.resume)
			}
		}
		if end.resume != ResumeEOF && end.resume != ResumeMoved && end.resume != ResumeGoneAbsorbed {
			at.Backend.ReportFailure(end.err) // a reset or a silence may be the upstream's health
		}
	}
	at.Cancel(nil)
	src.close()
	if v.step == stepEnd {
		if moved != nil {
			moved.at.Cancel(nil)
			moved.close()
		}
		return nil, v.end
	}
	brokeAt := f.h.clk.Now()
	if !end.silentSince.IsZero() {
		brokeAt = end.silentSince
	}
	// Why: a resume that delivers nothing is a failure, whatever its status line said: an
	// upstream that ends every watch at once would otherwise be asked again at once,
	// forever (15,209 requests in 10 s from one client watch). A move is no
	// failure: watchsan ended the attempt itself. Nor is a stall: the upstream accepted the
	// attempt and it stayed open, silent, for the whole stall timeout, which is at most one
	// request per stall timeout, and exactly what an apiserver sends a caught-up watch of a
	// resource nothing changes (docs/design.md section 2). Counting it would end a healthy
	// quiet watch's stream at its second stall.
	neutral := end.progress || end.resume == ResumeMoved || end.resume == ResumeStall
	// The brake paces what the backoff does not: resumes after a stream that ended young
	// though it delivered (brake.go). A move's accepted target was asked by the pool, not here.
	if wait := f.brake.ended(f.h.clk.Now()); wait > 0 && neutral && moved == nil {
		if final := f.braked(wait); final != endNone {
			return nil, final
		}
	}
	if neutral || f.brokeAt.IsZero() {
		f.brokeAt = brokeAt
		f.giveUpAt = f.h.clk.Now().Add(f.h.cfg.ResumeTimeout)
	}
	if neutral {
		f.backoff.Reset()
	}
	next := moved
	if v.step == stepSwitch {
		f.switchTo(moved, end)
	} else {
		resumed, final := f.resume(end)
		if final != endNone {
			return nil, final
		}
		next = f.source(resumed)
	}
	f.stallResumedAt = time.Time{}
	if end.resume == ResumeStall {
		f.stallResumedAt = f.h.clk.Now()
	}
	return next, endNone
}

// ending is how the attempt that ended as end ended, for decideNext; moved: a move's target
// accepted the watch meanwhile.
func (f *feed) ending(end attemptEnd, moved bool) ending {
	if end.end != endNone {
		return ending{how: howEnded, end: end.end}
	}
	return ending{how: howBroke, moved: moved, maxLifetime: f.maxLifetime,
		resumable:    !f.h.cfg.DisableResume && !f.sub.InInitialPhase() && f.sub.LastDelivered() != "",
		overDeadline: !f.deadline.IsZero() && !f.h.clk.Now().Before(f.deadline)}
}

// receive reads one attempt until it ends, handing each event to the sink, and leaves in
// src.end what happened, which is what to do next, as client-go's RetryWatcher.doReceive does
// (tools/watch/retrywatcher.go): end the client's stream (attemptEnd.end), or resume it, why,
// and whether the attempt made progress (no backoff then). The caller ends the attempt.
func (f *feed) receive(src *source) {
	defer f.received(src)
	if f.receiving(src) {
		f.pump(src)
	}
}

// receiving makes src the feed's attempt: the lease told, the watchdog started, and for a
// move's target the resume point to skip up to (src.skip; a prefix delivered first). False:
// the attempt ended already (src.end says how).
func (f *feed) receiving(src *source) bool {
	at := src.at
	f.lease = at.Lease
	f.brake.started(f.h.clk.Now())
	f.lease.SetMovable(f.movable())
	// Busy until a read from the upstream waits (attemptBody.Read): a move's target may first
	// deliver what it read ahead, and the prefix.
	f.lease.Busy()

	src.body.live.Store(true)
	src.stopWatchdog = f.watchdog(at.Resp.Request.Context(), at, &src.silentSince)
	go f.awaitMove(src) // ends with the attempt
	src.start = f.progress
	// A moved watch's target started from the resume point the move read, at most the one
	// delivered now: what the old attempt delivered since comes again, in the same order (one
	// etcd, one scope), and is skipped (docs/design.md section 10.1).
	if src.dedupe {
		src.skip, _ = f.resumePoint()
		if p := src.prefix; p != nil {
			if n := p.RVInt; n > src.skip {
				f.events++
				if werr := f.deliver(p); werr != nil {
					src.end = f.clientEnd()
					return false
				}
				src.skip = n
			}
		}
	}
	return true
}

// received is what receive does once its attempt ended, whatever ended it. Events are batched
// and flushed only when the reader is about to wait for the upstream (flushBeforeRead), as the
// apiserver flushes only when no further event is queued: one write(2) per read instead of one
// per event, and no event ever waits unflushed for the network. What is still batched when
// the attempt ends goes out before the feed waits for anything else (a resume, the end of the
// stream).
func (f *feed) received(src *source) {
	_ = f.sub.flush()
	if src.stopWatchdog != nil {
		src.stopWatchdog()
	}
	_ = src.at.Resp.Body.Close()
}

// pump hands the attempt's events to the sink until it ends, and leaves in src.end how
// (receive).
func (f *feed) pump(src *source) {
	first := true
	for {
		ev, err := src.next()
		if err != nil {
			f.readEnd(src, err)
			return
		}
		if src.skip > 0 {
			if ev.RVIsInt && ev.RVInt <= src.skip && ev.Type != stream.Error {
				continue
			}
			src.skip = 0
		}
		if first && ev.Type == stream.Error && f.goneHere(src, ev) {
			return
		}
		first = false
		if ev.Type == stream.Error && f.absorbError(src, ev) {
			return
		}
		f.events++
		if werr := f.deliver(ev); werr != nil {
			src.end = f.clientEnd()
			return
		}
		if ev.InitialEventsEnd && f.handoff != nil && !f.handoff.tried && f.handoff.try(f) {
			src.end = attemptEnd{end: endHandedOff} // on the shared feed now: this attempt ends
			return
		}
		f.lease.SetMovable(f.movable())
		if ev.Type == stream.Error {
			src.end = f.endAfterError(ev)
			return
		}
	}
}

// readEnd leaves in src.end how the attempt src ended when a read from it failed with err.
func (f *feed) readEnd(src *source, err error) {
	if e, _ := f.sub.broken(); e != endNone {
		src.end = f.clientEnd()
		return
	}
	end := f.classify(src.at.Resp.Request.Context(), err)
	end.progress = f.progress > src.start
	if end.resume == ResumeStall {
		end.silentSince = time.Unix(0, src.silentSince.Load())
	}
	src.end = end
}

// absorbError handles an ERROR 410 from the upstream that the feed absorbs (absorb.go): true
// when it did, or the client's stream ended meanwhile (src.end says which); false: the ERROR
// is the client's.
func (f *feed) absorbError(src *source, ev *stream.Event) bool {
	st, err := stream.DecodeStatus(f.format, ev)
	if err != nil || st.Code != http.StatusGone {
		return false
	}
	f.lease.SetMovable(false) // the resume point changes under the absorb
	ok, end := f.absorbGone(st)
	switch decideNext(absorbEnding(ok, end)).step {
	case stepRelist:
		return false // passed on, and the stream ends with it (endAfterError)
	case stepResume:
		// The upstream ends its watch after the ERROR: resumed from the list's
		// resourceVersion at once, the absorb's events counting as progress (a run of
		// absorbs is paced by its own backoff).
		end = attemptEnd{resume: ResumeGoneAbsorbed, progress: true}
	}
	src.end = end
	return true
}

// absorbEnding is how an absorb (absorbGone's answer: ok, end) went, for decideNext.
func absorbEnding(ok bool, end attemptEnd) ending {
	switch {
	case ok:
		return ending{how: howAbsorbed}
	case end.end != endNone:
		return ending{how: howEnded, end: end.end}
	}
	return ending{how: howNotAbsorbed}
}

// endAfterError ends the client's stream after the upstream's ERROR event, as the apiserver
// ends its own: resuming would only fetch the same ERROR again (a 410 on a real apiserver comes
// as HTTP 200 and an ERROR event, not as a 410 status).
func (f *feed) endAfterError(ev *stream.Event) attemptEnd {
	st, err := stream.DecodeStatus(f.format, ev)
	if err == nil && st.Code == http.StatusGone {
		f.h.deps.Metrics.RelistsForced.Inc()
		f.h.note("relist", f.backend, f.client.URL.Path, "the upstream's 410 passed on, from resourceVersion "+f.sub.LastDelivered())
		f.log.Info("upstream said the watch's resourceVersion is gone; the client relists",
			zap.String("path", f.client.URL.Path), zap.String("fromRV", f.sub.LastDelivered()), zap.String("message", st.Message))
		return attemptEnd{end: EndRelist}
	}
	f.log.Info("upstream ended the watch with an ERROR event", zap.String("path", f.client.URL.Path), zap.Error(err))
	return attemptEnd{end: EndUpstreamError}
}

// stallBacklogWindow is how soon after a stall's resume an object event counts as backlog the
// silent stream held back: an apiserver writes the events after the resume point at once.
const stallBacklogWindow = time.Second

// judgeStall tells, from the first delivery after a stall's resume, whether the silent stream
// had hung. A watch from the resume point gets at once every event after it: object events
// at once mean the silent stream held them back (a hung apiserver or L7 hop). A bookmark, or
// nothing for a while, means the watch was caught up and its resource unchanged, which an
// apiserver also answers with silence (docs/design.md section 2).
func (f *feed) judgeStall(ev *stream.Event) {
	at := f.stallResumedAt
	f.stallResumedAt = time.Time{}
	switch ev.Type {
	case stream.Bookmark, stream.Error:
		return
	}
	if f.h.clk.Since(at) > stallBacklogWindow {
		return
	}
	f.h.deps.Metrics.StallsHung.Inc()
	f.log.Warn("the upstream watch had hung: its resume delivered at once events the silent stream had held back",
		zap.String("path", f.client.URL.Path), zap.String("type", ev.Type), zap.String("rv", ev.RV))
}

// deliver hands one event to the sink: its policy decides, the lease learns how far the watch
// got, and the sink writes it (or not).
func (f *feed) deliver(ev *stream.Event) error {
	if !f.stallResumedAt.IsZero() {
		f.judgeStall(ev)
	}
	return f.pass(ev, f.sub.decide(ev))
}

// pass hands the sink an event its policy decided d: the state and the lease learn of it, and
// the sink writes it (unless dropped).
func (f *feed) pass(ev *stream.Event, d fix.Decision) error {
	if d.Action == fix.Drop {
		return nil
	}
	if f.keepsState() {
		f.observeState(ev)
	}
	if ho := f.handoff; ho != nil && ev.RVIsInt && d.Action == fix.Pass && ev.Type != stream.Bookmark && ev.Type != stream.Error {
		ho.newest = max(ho.newest, ev.RVInt)
	}
	f.reportProgress(ev, d)
	f.progress++
	return f.sub.write(ev, d)
}

// clientEnd is how the stream ends after a write to the client failed.
func (f *feed) clientEnd() attemptEnd {
	e, err := f.sub.broken()
	return attemptEnd{end: e, err: err}
}

// reportProgress tells the lease how far the watch got: its resume point, and (in the live
// phase) the RV of an object event that every watch of its scope must deliver too.
func (f *feed) reportProgress(ev *stream.Event, d fix.Decision) {
	n, ok := ev.RVInt, ev.RVIsInt
	if d.Action == fix.Rewrite {
		n, ok = d.RVInt, true // a rewrite's resourceVersion is an integer (fix.Decision)
	}
	switch {
	case ev.Type == stream.Error || !ok:
		return // no position; the read that brought it told the lease the backend is alive
	case f.sub.InInitialPhase():
		f.lease.Observed(n) // a real RV of the upstream's, for the high-water mark
		return
	}
	var event uint64
	if ev.Type != stream.Bookmark && d.Action == fix.Pass {
		event = n
	}
	f.lease.Progress(n, event)
}

// attemptBody is an attempt's response body as its reader reads it. Once the attempt is the
// feed's (receive), it flushes the sink's pending events before every read from the
// upstream: a read is where the feed may wait for the network, and an event must not wait
// with it. Before that (a move's target, read ahead while the old attempt still feeds the
// client) it flushes nothing. It tells the lease when the watch waits for its upstream (from
// after the flush: the time a write to the client takes is no silence of the upstream's, for
// the watchdog and the mover) and when it is busy with what it read, and gives the backend a
// sign of life: per read, not per event (a clock read per event was 3% of the CPU at
// saturation).
type attemptBody struct {
	r     io.Reader
	sink  sink
	live  atomic.Bool // the feed's attempt now (receive): flush before reading
	lease *upstream.Lease
	clk   clock.PassiveClock // the watch's: its watchdog reads the waiting time back
}

func (f *attemptBody) Read(p []byte) (int, error) {
	if f.live.Load() {
		if err := f.sink.flush(); err != nil {
			return 0, err
		}
	}
	f.lease.Waiting(f.clk.Now().UnixNano())
	n, err := f.r.Read(p)
	if n > 0 {
		f.lease.Busy()
		f.lease.Alive()
	}
	return n, err
}

// classify sorts an attempt's ending: the context's cause first (client, deadline, shutdown,
// stall), then the read error (clean EOF, a broken connection, garbage).
func (f *feed) classify(attemptCtx context.Context, err error) attemptEnd {
	if f.sub.gone() {
		return attemptEnd{end: f.h.leftEnd(f.client)}
	}
	switch cause := context.Cause(attemptCtx); {
	case errors.Is(cause, errShutdown):
		return attemptEnd{end: EndShutdown}
	case errors.Is(cause, errClientDeadline):
		return attemptEnd{end: f.deadlineEnd()}
	case errors.Is(cause, errRebalance):
		return attemptEnd{end: EndRebalance}
	case errors.Is(cause, errStalled):
		return attemptEnd{resume: ResumeStall, err: err}
	case errors.Is(cause, errOverBudget):
		f.log.Warn("the watch held the most of the memory budget past its high mark; ending the client's stream cleanly",
			zap.String("path", f.client.URL.Path), zap.Int64("held", f.mem.Held()))
		return attemptEnd{end: EndMemory, err: cause}
	}
	var moved *upstream.MoveError
	if errors.As(context.Cause(attemptCtx), &moved) {
		return attemptEnd{resume: ResumeMoved, err: moved, move: moved.Reason}
	}
	switch {
	case errors.Is(err, io.EOF):
		if !f.deadline.IsZero() && f.deadline.Sub(f.h.clk.Now()) < time.Second {
			return attemptEnd{end: f.deadlineEnd()}
		}
		return attemptEnd{resume: ResumeEOF}
	case errors.Is(err, stream.ErrFrameTooLarge), errors.Is(err, stream.ErrMalformed):
		f.log.Warn("garbage from upstream; ending the client's stream cleanly",
			zap.String("path", f.client.URL.Path), zap.Stringer("upstream", f.backend), zap.Error(err))
		return attemptEnd{end: EndMalformed, err: err}
	case errors.Is(err, stream.ErrOverBudget):
		// Ended as the apiserver ends a watcher it cannot afford: the client re-watches from
		// its last resourceVersion, when memory may be there again (package budget).
		f.log.Warn("the memory budget refused a frame's buffer; ending the client's stream cleanly",
			zap.String("path", f.client.URL.Path), zap.Int64("held", f.mem.Held()))
		return attemptEnd{end: EndMemory, err: err}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return attemptEnd{resume: ResumeTruncated, err: err}
	default:
		return attemptEnd{resume: ResumeReset, err: err}
	}
}

// watchdog ends the attempt (cause errStalled) when the watch has waited for its upstream for
// the stall timeout and the upstream sent nothing, not even a bookmark. watchsan always asks
// for bookmarks, but an apiserver sends them only while the watch's resource changes
// (docs/design.md section 2): a silence is a hung stream, or a watch of a resource nothing
// changes, and it cannot tell which; the resume that follows does (judgeStall). It resumes
// even if the upstream answers probes: the hop between may be what hangs. Resuming is
// lossless, so a false alarm costs one request. Time the watch spends busy on its client
// (the lease is not waiting) is nobody's silence: the client's write deadline bounds it
// (a client that stopped reading got a healthy upstream counted as stalled and
// reported as failing). It is a timer, not a goroutine: the lease is checked lazily when it
// fires (a busy watch never touches the timer), and it runs only until stop is called or the
// attempt ends.
// It stores when the silence began in silentSince before it ends the attempt.
func (f *feed) watchdog(ctx context.Context, at upstream.Attempt, silentSince *atomic.Int64) (stop func()) {
	stall := f.h.cfg.StallTimeout
	var (
		mu      sync.Mutex
		stopped bool
		t       clock.Timer
	)
	check := func() {
		if ctx.Err() != nil {
			return
		}
		var idle time.Duration // busy on the client: not waiting at all
		since, waiting := at.Lease.WaitingSince()
		if waiting {
			idle = f.h.clk.Since(since)
		}
		if idle < stall {
			mu.Lock()
			if !stopped {
				t.Reset(stall - idle)
			}
			mu.Unlock()
			return
		}
		f.h.deps.Metrics.Stalls.Inc()
		// Info, not a warning: a caught-up watch of a resource nothing changes is silent too
		// (docs/design.md section 2), and this cannot tell the two apart.
		f.log.Info("upstream watch silent: nothing, not even a bookmark, for the stall timeout (a hung path, or a resource nothing changes); resuming it",
			zap.String("path", f.client.URL.Path), zap.Stringer("upstream", at.Backend), zap.Duration("silent", idle))
		silentSince.Store(since.UnixNano())
		at.Cancel(errStalled)
	}
	mu.Lock()
	t = f.h.clk.AfterFunc(stall, check)
	mu.Unlock()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

// resume opens the watch again from the resume point, through the Attempter (another backend
// than the broken one when there is one), after a backoff when the last attempt made no
// progress: the Attempter waits it out (Plan.AfterFailure), with the watch's one backoff, the
// same one that paces its retries, so every wait of the watch's resumes is stepped in one
// place (docs/design.md section 5). It gives up at giveUpAt. It returns the new attempt, or
// the end reason. What follows each answer is decideNext's: a 410 is absorbed when it can be
// and the watch resumed again from the list's resourceVersion, in this loop.
func (f *feed) resume(end attemptEnd) (upstream.Attempt, EndReason) {
	for {
		at, e, st := f.resumeOnce(end)
		v := decideNext(e)
		if v.step == stepAbsorb {
			v = decideNext(absorbEnding(f.absorbGone(st)))
		}
		switch v.step {
		case stepGoOn:
			return at, endNone
		case stepResume: // absorbed: a run of absorbs is paced by its own backoff and bounded (absorbGone)
			end = attemptEnd{resume: ResumeGoneAbsorbed, progress: true}
		case stepRelist:
			return upstream.Attempt{}, f.forceRelist(st)
		default:
			return upstream.Attempt{}, v.end
		}
	}
}

// resumeOnce sends one resume of the watch that broke as end (resume) and says how it was
// answered: the attempt when it is a stream the feed reads (counted and logged as a resume),
// and for a 410 the status the upstream sent (nil: none readable).
func (f *feed) resumeOnce(end attemptEnd) (upstream.Attempt, ending, *metav1.Status) {
	failed := !end.progress && end.resume != ResumeMoved && end.resume != ResumeStall // see run
	var avoid *upstream.Backend
	if end.resume != ResumeEOF || !end.progress {
		avoid = f.backend
	}
	fromRV := f.sub.LastDelivered()
	from, _ := f.resumePoint()
	plan := f.plan(from)
	plan.Avoid, plan.Deadline, plan.Backoff, plan.WaitForBackend = avoid, f.giveUpAt, &f.backoff, true
	plan.AfterFailure = failed
	at, err := f.h.deps.Attempts.Do(f.ctx, f.upstreamRequest(false), plan)
	if err != nil {
		if f.ctx.Err() != nil || f.h.stopping() {
			return upstream.Attempt{}, ending{how: howEnded, end: f.endFromContext()}, nil
		}
		if !errors.Is(err, upstream.ErrDeadline) { // else the break's own error says more
			end.err = err
		}
		f.giveUp(end)
		return upstream.Attempt{}, ending{how: howResumeFailed}, nil
	}
	resp := at.Resp
	switch {
	case f.readsAs(resp):
		gap := f.resumedOn(at.Backend, end.resume)
		fields := []zap.Field{zap.String("path", f.client.URL.Path), zap.Stringer("reason", end.resume),
			zap.Bool("progress", end.progress), zap.String("fromRV", fromRV), zap.Duration("gap", gap), zap.Stringer("upstream", at.Backend),
			zap.Int("failures", f.backoff.Failures())}
		if end.resume == ResumeMoved {
			fields = append(fields, zap.Stringer("movedBecause", end.move))
		}
		f.log.Info("resumed upstream watch", fields...)
		return at, ending{how: howResumed}, nil
	case resp.StatusCode == http.StatusGone:
		st := readStatus(resp)
		at.Cancel(nil)
		return upstream.Attempt{}, ending{how: howResumeGone}, st
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests:
		drain(resp) // the Attempter ran out of time retrying these
		at.Cancel(nil)
		end.err = errors.New("upstream answered " + resp.Status)
		f.giveUp(end)
		return upstream.Attempt{}, ending{how: howResumeFailed}, nil
	default:
		f.log.Warn("upstream refused the resumed watch; ending the client's stream cleanly",
			zap.String("path", f.client.URL.Path), zap.Int("code", resp.StatusCode), zap.Stringer("upstream", at.Backend))
		drain(resp)
		at.Cancel(nil)
		return upstream.Attempt{}, ending{how: howResumeRefused}, nil
	}
}

// resumedOn counts a resume (why: how the last attempt ended) that goes on on b, the feed's
// backend from now on, and returns how long the client's stream had no upstream (since
// brokeAt).
func (f *feed) resumedOn(b *upstream.Backend, why ResumeReason) time.Duration {
	gap := f.h.clk.Since(f.brokeAt)
	f.resumes++
	f.backend = b
	f.h.deps.Metrics.Resumes.WithLabelValues(why.String()).Inc()
	f.h.deps.Metrics.ResumeSeconds.Observe(gap.Seconds())
	return gap
}

// firstAnswer makes the first attempt's backend the feed's, and its format, when it is a
// stream the feed reads (readable), every later attempt's: false when it is not.
func (f *feed) firstAnswer(first upstream.Attempt) (stream.Format, bool) {
	f.backend = first.Backend
	format, ok := readable(first.Resp)
	if ok {
		f.format = format
	}
	return format, ok
}

// braked waits d, the brake's wait before the next resume (brake.go), or until the feed's
// context ends: endNone, or how the client's stream ends then.
func (f *feed) braked(d time.Duration) EndReason {
	f.h.deps.Metrics.ResumeBrake.Observe(d.Seconds())
	lvl := zapcore.DebugLevel
	if f.brake.young == brakeFree+1 {
		lvl = zapcore.InfoLevel // once per run of young streams: when the brake starts to bite
	}
	if ce := f.log.Check(lvl, "upstream watch streams keep ending young; braking its resumes"); ce != nil {
		ce.Write(zap.String("path", f.client.URL.Path), zap.Int("youngStreams", f.brake.young), zap.Duration("wait", d),
			zap.Stringer("upstream", f.backend))
	}
	t := f.h.clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return endNone
	case <-f.ctx.Done():
		return f.endFromContext()
	}
}

// giveUp logs that resuming the watch that broke as end is given up (EndResumeTimeout).
func (f *feed) giveUp(end attemptEnd) {
	f.log.Warn("could not resume the upstream watch with progress in time; ending the client's stream cleanly",
		zap.String("path", f.client.URL.Path), zap.String("fromRV", f.sub.LastDelivered()),
		zap.Duration("after", f.h.clk.Since(f.brokeAt)), zap.Int("failures", f.backoff.Failures()), zap.Error(end.err))
}

// forceRelist tells the client its resume point is gone: a well-formed ERROR 410 in its format.
func (f *feed) forceRelist(st *metav1.Status) EndReason {
	f.sub.relist(goneStatus(st, f.sub.LastDelivered()))
	f.h.deps.Metrics.RelistsForced.Inc()
	f.h.note("relist", f.backend, f.client.URL.Path, "resume point expired upstream, from resourceVersion "+f.sub.LastDelivered())
	f.log.Info("resume point expired upstream; told the client to relist", zap.String("path", f.client.URL.Path), zap.String("fromRV", f.sub.LastDelivered()))
	return EndRelist
}

// goneStatus is st when it is a 410, else the one the apiserver sends for the expired
// resourceVersion rv.
func goneStatus(st *metav1.Status, rv string) *metav1.Status {
	if st != nil && st.Code == http.StatusGone {
		return st
	}
	return &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
		Code: http.StatusGone, Reason: metav1.StatusReasonExpired, Message: "too old resource version: " + rv}
}

func (f *feed) endFromContext() EndReason {
	switch cause := context.Cause(f.ctx); {
	case f.sub.gone():
		return f.h.leftEnd(f.client)
	case errors.Is(cause, errShutdown), f.h.stopping():
		return EndShutdown
	case errors.Is(cause, errClientDeadline):
		return f.deadlineEnd()
	case errors.Is(cause, errRebalance):
		return EndRebalance
	}
	return EndClientGone
}

func readStatus(resp *http.Response) *metav1.Status {
	defer drain(resp)
	var st metav1.Status
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st); err != nil || st.Code == 0 {
		return nil
	}
	return &st
}

func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}

// deadlineEnd is how the client's stream ends at the feed's deadline (see feed.maxLifetime).
func (f *feed) deadlineEnd() EndReason {
	return params{maxLifetime: f.maxLifetime}.deadlineEnd()
}

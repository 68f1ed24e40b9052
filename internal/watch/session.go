package watch

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/upstream"
)

// session is one client watch: an upstream side (its attempts, where they are, how they are
// resumed and moved) and a client side (the one response, the RV policy, what was written).
// The two meet only in pump, which hands each upstream event to the client side, and in the
// resume point the client side keeps (fix.Stream.LastDelivered), so that one upstream side
// could later feed several client sides. fix owns the initial phase and the resume point
// (fix.Stream.InInitialPhase, LastDelivered), for exempt resources too (fix.PassAll).
type session struct {
	h        *Handler
	client   *http.Request
	ctx      context.Context // ends with the client, its deadline, or shutdown (with a cause)
	params   params
	resource string
	deadline time.Time // the client's timeoutSeconds; zero: none
	cred     upstream.Credentials
	log      *zap.Logger

	upstreamSide
	clientSide
}

// upstreamSide is the upstream half of a session.
type upstreamSide struct {
	backend *upstream.Backend
	lease   *upstream.Lease // the current attempt's place on backend
	// nextSlot is where a move of the attempt resume just opened leaves its target (move.go).
	nextSlot *moveSlot

	// scope and groupResource tell the pool what the watch selects (lag detection) and of
	// which resource it delivers resourceVersions (the high-water mark).
	scope         string
	groupResource string

	// backoff paces resumes that make no progress. brokeAt is when the upstream last broke after
	// progress (for a stall: when it went silent), giveUpAt when resuming without progress since
	// then stops: ResumeTimeout after the break was found.
	backoff  upstream.Backoff
	brokeAt  time.Time
	giveUpAt time.Time
	resumes  int

	// stallResumedAt is when the attempt after a stall started; zero once its first delivery
	// has told whether the silent stream had hung (see judgeStall).
	stallResumedAt time.Time
}

// clientSide is the client half of a session.
type clientSide struct {
	w      http.ResponseWriter
	rc     *http.ResponseController
	format stream.Format
	out    batchWriter // what writer writes, batched until the pump would wait
	writer *stream.Writer
	fix    *fix.Stream

	events    uint64
	progress  uint64 // events written to the client, and bookmarks (shown or not)
	regressed bool
	counters  [6][3]prometheus.Counter // by event type index and fix.Action
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
// Its moves are make-before-break (tryMove, docs/design.md section 10.1): an accepted target
// is left in slot.
func (s *session) plan(from uint64, slot *moveSlot) upstream.Plan {
	return upstream.Plan{Watch: true, Scope: s.scope, Resource: s.groupResource, From: from, Credentials: s.cred,
		OnMove: func(l *upstream.Lease, r upstream.MoveReason) { s.tryMove(slot, l, r) }}
}

// movable says whether the watch can resume elsewhere without its client noticing.
func (s *session) movable() bool {
	return !s.h.cfg.DisableResume && !s.fix.InInitialPhase() && s.fix.HasResumePoint()
}

// run pumps the first attempt and every resume until the client's stream ends.
func (s *session) run(src *source) EndReason {
	for {
		at := src.at
		end := s.pump(src)
		// A move's target that accepted the watch meanwhile is where it goes on, whatever
		// ended this attempt (the Cut, or a break that came first).
		moved := src.slot.close()
		if end.end == endNone {
			end.end = s.resumable(end)
			if end.end == endNone && s.h.deps.OnBreak != nil {
				// Told while the attempt still holds its backend (a removed backend is not
				// forgotten before its watches have left it).
				s.h.deps.OnBreak(at.Backend, end.resume)
			}
			if end.resume != ResumeEOF && end.resume != ResumeMoved {
				at.Backend.ReportFailure(end.err) // a reset or a silence may be the upstream's health
			}
		}
		at.Cancel(nil)
		if end.end != endNone {
			if moved != nil {
				moved.at.Cancel(nil)
			}
			return end.end
		}
		brokeAt := s.h.clk.Now()
		if !end.silentSince.IsZero() {
			brokeAt = end.silentSince
		}
		// Why: a resume that delivers nothing is a failure, whatever its status line said: an
		// upstream that ends every watch at once would otherwise be asked again at once,
		// forever (issue #7: 15,209 requests in 10 s from one client watch). A move is no
		// failure: watchsan ended the attempt itself. Nor is a stall: the upstream accepted the
		// attempt and it stayed open, silent, for the whole stall timeout, which is at most one
		// request per stall timeout, and exactly what an apiserver sends a caught-up watch of a
		// resource nothing changes (docs/design.md section 2). Counting it would end a healthy
		// quiet watch's stream at its second stall.
		neutral := end.progress || end.resume == ResumeMoved || end.resume == ResumeStall
		if neutral || s.brokeAt.IsZero() {
			s.brokeAt = brokeAt
			s.giveUpAt = s.h.clk.Now().Add(s.h.cfg.ResumeTimeout)
		}
		if neutral {
			s.backoff.Reset()
		}
		if moved != nil {
			s.switchTo(moved, end)
			src = moved
		} else {
			next, final := s.resume(end)
			if final != endNone {
				return final
			}
			src = s.source(next, s.nextSlot)
		}
		s.stallResumedAt = time.Time{}
		if end.resume == ResumeStall {
			s.stallResumedAt = s.h.clk.Now()
		}
	}
}

// resumable says how the client's stream ends after its upstream watch broke, or endNone
// when the watch is resumed.
func (s *session) resumable(end attemptEnd) EndReason {
	if s.h.cfg.DisableResume || s.fix.InInitialPhase() || s.fix.LastDelivered() == "" {
		s.log.Info("upstream watch ended; ending the client's stream so it re-watches",
			zap.String("path", s.client.URL.Path), zap.Stringer("why", end.resume), zap.Bool("initialPhase", s.fix.InInitialPhase()), zap.Error(end.err))
		return EndNoResume
	}
	if !s.deadline.IsZero() && !s.h.clk.Now().Before(s.deadline) {
		return EndDeadline
	}
	return endNone
}

// pump reads one upstream response until it ends, writing what the policy lets through. The
// caller ends the attempt.
func (s *session) pump(src *source) attemptEnd {
	at := src.at
	resp := at.Resp
	attemptCtx := resp.Request.Context()
	defer resp.Body.Close()
	s.lease = at.Lease
	s.lease.SetMovable(s.movable())
	// Busy until a read from the upstream waits (attemptBody.Read): a move's target may first
	// deliver what it read ahead, and the prefix.
	s.lease.Busy()

	src.body.out.Store(&s.out)
	var silentSince atomic.Int64 // when the upstream went silent, once the watchdog found it stalled
	stopWatchdog := s.watchdog(attemptCtx, at, &silentSince)
	defer stopWatchdog()

	start := s.progress
	// Events are batched and flushed only when the reader is about to wait for the upstream
	// (flushBeforeRead), as the apiserver flushes only when no further event is queued: one
	// write(2) per read instead of one per event, and no event ever waits unflushed for the
	// network. What is still batched when the attempt ends goes out before the session waits
	// for anything else (a resume, the end of the stream).
	defer s.out.flush()
	// A moved watch's target started from the resume point the move read, at most the one
	// delivered now: what the old attempt delivered since comes again, in the same order (one
	// etcd, one scope), and is skipped (docs/design.md section 10.1).
	var skip uint64
	if src.dedupe {
		skip, _ = stream.ParseRV(s.fix.LastDelivered())
		if p := src.prefix; p != nil {
			if n, _ := stream.ParseRV(p.RV); n > skip {
				s.events++
				if werr := s.deliver(p); werr != nil {
					return s.out.clientEnd()
				}
				skip = n
			}
		}
	}
	first := true
	for {
		ev, err := src.next()
		if err != nil {
			if s.out.err != nil {
				return s.out.clientEnd()
			}
			end := s.classify(attemptCtx, err)
			end.progress = s.progress > start
			if end.resume == ResumeStall {
				end.silentSince = time.Unix(0, silentSince.Load())
			}
			return end
		}
		if skip > 0 {
			if n, ok := stream.ParseRV(ev.RV); ok && n <= skip && ev.Type != stream.Error {
				continue
			}
			skip = 0
		}
		if first && ev.Type == stream.Error {
			if end, ok := s.goneHere(at, ev); ok {
				return end
			}
		}
		first = false
		s.events++
		if werr := s.deliver(ev); werr != nil {
			return s.out.clientEnd()
		}
		s.lease.SetMovable(s.movable())
		if ev.Type == stream.Error {
			return s.endAfterError(ev)
		}
	}
}

// endAfterError ends the client's stream after the upstream's ERROR event, as the apiserver
// ends its own: resuming would only fetch the same ERROR again (a 410 on a real apiserver comes
// as HTTP 200 and an ERROR event, not as a 410 status).
func (s *session) endAfterError(ev *stream.Event) attemptEnd {
	st, err := stream.DecodeStatus(s.format, ev)
	if err == nil && st.Code == http.StatusGone {
		s.h.deps.Metrics.RelistsForced.Inc()
		s.log.Info("upstream said the watch's resourceVersion is gone; the client relists",
			zap.String("path", s.client.URL.Path), zap.String("fromRV", s.fix.LastDelivered()), zap.String("message", st.Message))
		return attemptEnd{end: EndRelist}
	}
	s.log.Info("upstream ended the watch with an ERROR event", zap.String("path", s.client.URL.Path), zap.Error(err))
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
func (s *session) judgeStall(ev *stream.Event) {
	at := s.stallResumedAt
	s.stallResumedAt = time.Time{}
	switch ev.Type {
	case stream.Bookmark, stream.Error:
		return
	}
	if s.h.clk.Since(at) > stallBacklogWindow {
		return
	}
	s.h.deps.Metrics.StallsHung.Inc()
	s.log.Warn("the upstream watch had hung: its resume delivered at once events the silent stream had held back",
		zap.String("path", s.client.URL.Path), zap.String("type", ev.Type), zap.String("rv", ev.RV))
}

// deliver applies the policy to one event and writes it (or not).
func (s *session) deliver(ev *stream.Event) error {
	if !s.stallResumedAt.IsZero() {
		s.judgeStall(ev)
	}
	d := s.fix.Decide(ev)
	m := s.h.deps.Metrics
	if d.Would != fix.Pass && !s.regressed {
		s.regressed = true // counted at the first regression, so a long watch shows up at once
		m.WatchRegressed.WithLabelValues(s.resource).Inc()
	}
	ti := typeIndex(ev.Type)
	s.counter(ti, d.Would).Inc()
	if d.Reason == fix.ReasonNotInteger {
		m.NonIntegerRVs.WithLabelValues(s.resource).Inc()
	}
	if ce := s.log.Check(zapcore.DebugLevel, "event"); ce != nil {
		ce.Write(zap.String("type", ev.Type), zap.String("rv", ev.RV), zap.String("name", ev.Name),
			zap.Stringer("action", d.Would), zap.Stringer("reason", d.Reason), zap.String("newRV", d.RV))
	}
	if d.Action == fix.Drop {
		return nil
	}
	s.reportProgress(ev, d)
	s.progress++
	// Bookmarks go only to clients that asked for them (watchsan asks upstream always, to see
	// progress on quiet watches); they still advance the resume point (fix.LastDelivered).
	if ev.Type == stream.Bookmark && !s.params.allowBookmarks {
		return nil
	}
	var err error
	if d.Action == fix.Rewrite {
		err = s.writer.WriteWithRV(ev, d.RV)
	} else {
		err = s.writer.Write(ev)
	}
	// Not flushed here: the pump's reader flushes before it waits (attemptBody).
	return err
}

// reportProgress tells the lease how far the watch got: its resume point, and (in the live
// phase) the RV of an object event that every watch of its scope must deliver too.
func (s *session) reportProgress(ev *stream.Event, d fix.Decision) {
	rv := ev.RV
	if d.Action == fix.Rewrite {
		rv = d.RV
	}
	n, ok := stream.ParseRV(rv)
	switch {
	case ev.Type == stream.Error || !ok:
		return // no position; the read that brought it told the lease the backend is alive
	case s.fix.InInitialPhase():
		s.lease.Observed(n) // a real RV of the upstream's, for the high-water mark
		return
	}
	var event uint64
	if ev.Type != stream.Bookmark && d.Action == fix.Pass {
		event = n
	}
	s.lease.Progress(n, event)
}

// batchSize is the most a batch of events holds before it is written: what the Reader reads
// at most at once (stream's busy buffer), so a busy watch writes once per upstream read.
const batchSize = 64 << 10

// batchPool holds batch buffers between bursts: a quiet watch holds none.
var batchPool = sync.Pool{New: func() any { b := make([]byte, 0, batchSize); return &b }}

// batchWriter collects whole events for the client's response and writes them in one go when
// flushed (or when the next event would not fit). The first error is sticky: the client's
// connection is broken then, and nothing more is written to it.
//
// What one flush sends the client (the events of one upstream read, at most a batch and any
// frames too big for one) gets timeout (Config.WriteTimeout) to get through: a client that
// stops reading fills its connection's buffers, and then the write blocks. Without a deadline
// it would block for good, the watch holding its upstream stream open (issue 16: 100 watches
// that never read held 431 MiB, and passed for stalled upstreams). With one, the write fails,
// the watch ends (EndSlowClient) and its upstream watch is closed. The deadline is set at the
// first write after a flush and cleared when the flush is done: it bounds writing, never the
// time between writes (a quiet watch writes nothing for minutes), and over HTTP/2 a deadline
// is the stream's, which resets the stream when it passes whether or not a write is pending.
type batchWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf *[]byte // from batchPool while it holds something; nil otherwise
	// unflushed: bytes were handed to w since its last flush.
	unflushed bool
	err       error

	// timeout bounds writing out what one flush sends; 0: none (the writer cannot set deadlines).
	timeout time.Duration
	// deadline is the current flush's, zero between flushes; slow: a write failed at it (the
	// client did not read).
	deadline time.Time
	slow     bool
}

// newBatchWriter writes to w, what each flush sends bounded by timeout.
func newBatchWriter(w http.ResponseWriter, rc *http.ResponseController, timeout time.Duration) batchWriter {
	return batchWriter{w: w, rc: rc, timeout: timeout}
}

// arm starts the deadline of the flush that the write about to start is part of, unless it
// runs already. Per flush, not per watch: a client that reads, however slowly, only has to
// take each flush's worth within the timeout.
func (b *batchWriter) arm() {
	if b.timeout <= 0 || !b.deadline.IsZero() {
		return
	}
	b.deadline = time.Now().Add(b.timeout)
	if err := b.rc.SetWriteDeadline(b.deadline); err != nil {
		b.timeout = 0 // a ResponseWriter that cannot (a test's recorder): no deadline, as before
		b.deadline = time.Time{}
	}
}

// disarm clears the deadline once a flush is through (see batchWriter).
func (b *batchWriter) disarm() {
	if b.deadline.IsZero() {
		return
	}
	b.deadline = time.Time{}
	if b.err == nil {
		_ = b.rc.SetWriteDeadline(time.Time{})
	}
}

// fail records the first error of a write to the client and whether it was the deadline's:
// an HTTP/1 connection says so (os.ErrDeadlineExceeded), an HTTP/2 stream is reset when its
// deadline passes and only says it is closed, hence the clock.
func (b *batchWriter) fail(err error) {
	b.err = err
	if !b.deadline.IsZero() && (errors.Is(err, os.ErrDeadlineExceeded) || !time.Now().Before(b.deadline)) {
		b.slow = true
	}
}

// clientEnd is how the stream ends after a write to the client failed.
func (b *batchWriter) clientEnd() attemptEnd {
	if b.slow {
		return attemptEnd{end: EndSlowClient, err: b.err}
	}
	return attemptEnd{end: EndClientGone, err: b.err}
}

func (b *batchWriter) Write(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.buf != nil && len(*b.buf)+len(p) > batchSize {
		b.writeOut()
		if b.err != nil {
			return 0, b.err
		}
	}
	if len(p) >= batchSize {
		// Nothing to gain from copying a frame this big; it goes out as it is.
		b.unflushed = true
		b.arm()
		if _, err := b.w.Write(p); err != nil {
			b.fail(err)
			return 0, err
		}
		return len(p), nil
	}
	if b.buf == nil {
		b.buf = batchPool.Get().(*[]byte)
	}
	*b.buf = append(*b.buf, p...)
	return len(p), nil
}

// writeOut hands the batch to the response writer, without flushing it, and returns the
// buffer to the pool.
func (b *batchWriter) writeOut() {
	if b.buf == nil {
		return
	}
	if len(*b.buf) > 0 && b.err == nil {
		b.unflushed = true
		b.arm()
		if _, err := b.w.Write(*b.buf); err != nil {
			b.fail(err)
		}
	}
	*b.buf = (*b.buf)[:0]
	batchPool.Put(b.buf)
	b.buf = nil
}

// flush writes the batch out and flushes the response to the client.
func (b *batchWriter) flush() error {
	if b.buf == nil && !b.unflushed {
		return b.err
	}
	b.writeOut()
	return b.flushClient()
}

// flushClient flushes what the response writer holds to the client (the status line and
// headers too, before the first event).
func (b *batchWriter) flushClient() error {
	b.unflushed = false
	if b.err == nil {
		b.arm()
		if err := b.rc.Flush(); err != nil {
			b.fail(err)
		}
	}
	b.disarm()
	return b.err
}

// attemptBody is an attempt's response body as its reader reads it. Once the attempt is the
// session's (pump), it flushes the client's pending events before every read from the
// upstream: a read is where the pump may wait for the network, and an event must not wait
// with it. Before that (a move's target, read ahead while the old attempt still feeds the
// client) it flushes nothing. It tells the lease when the watch waits for its upstream (from
// after the flush: the time a write to the client takes is no silence of the upstream's, for
// the watchdog and the mover) and when it is busy with what it read, and gives the backend a
// sign of life: per read, not per event (a clock read per event was 3% of the CPU at
// saturation).
type attemptBody struct {
	r     io.Reader
	out   atomic.Pointer[batchWriter]
	lease *upstream.Lease
	clk   clock.PassiveClock // the watch's: its watchdog reads the waiting time back
}

func (f *attemptBody) Read(p []byte) (int, error) {
	if out := f.out.Load(); out != nil {
		if err := out.flush(); err != nil {
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

var typeNames = [...]string{stream.Added, stream.Modified, stream.Deleted, stream.Bookmark, stream.Error, "other"}

func typeIndex(t string) int {
	for i, n := range typeNames[:5] {
		if t == n {
			return i
		}
	}
	return 5
}

func (s *session) counter(ti int, a fix.Action) prometheus.Counter {
	if int(a) >= 3 {
		a = fix.Pass
	}
	c := s.counters[ti][a]
	if c == nil {
		c = s.h.deps.Metrics.WatchEvents.WithLabelValues(s.resource, typeNames[ti], a.String())
		s.counters[ti][a] = c
	}
	return c
}

// classify sorts an attempt's ending: the context's cause first (client, deadline, shutdown,
// stall), then the read error (clean EOF, a broken connection, garbage).
func (s *session) classify(attemptCtx context.Context, err error) attemptEnd {
	if s.client.Context().Err() != nil {
		return attemptEnd{end: EndClientGone}
	}
	switch cause := context.Cause(attemptCtx); {
	case errors.Is(cause, errShutdown):
		return attemptEnd{end: EndShutdown}
	case errors.Is(cause, errClientDeadline):
		return attemptEnd{end: EndDeadline}
	case errors.Is(cause, errStalled):
		return attemptEnd{resume: ResumeStall, err: err}
	}
	var moved *upstream.MoveError
	if errors.As(context.Cause(attemptCtx), &moved) {
		return attemptEnd{resume: ResumeMoved, err: moved, move: moved.Reason}
	}
	switch {
	case errors.Is(err, io.EOF):
		if !s.deadline.IsZero() && s.deadline.Sub(s.h.clk.Now()) < time.Second {
			return attemptEnd{end: EndDeadline}
		}
		return attemptEnd{resume: ResumeEOF}
	case errors.Is(err, stream.ErrFrameTooLarge), errors.Is(err, stream.ErrMalformed):
		s.log.Warn("garbage from upstream; ending the client's stream cleanly",
			zap.String("path", s.client.URL.Path), zap.Stringer("upstream", s.backend), zap.Error(err))
		return attemptEnd{end: EndMalformed, err: err}
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
// (issue 16: a client that stopped reading got a healthy upstream counted as stalled and
// reported as failing). It is a timer, not a goroutine: the lease is checked lazily when it
// fires (a busy watch never touches the timer), and it runs only until stop is called or the
// attempt ends.
// It stores when the silence began in silentSince before it ends the attempt.
func (s *session) watchdog(ctx context.Context, at upstream.Attempt, silentSince *atomic.Int64) (stop func()) {
	stall := s.h.cfg.StallTimeout
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
			idle = s.h.clk.Since(since)
		}
		if idle < stall {
			mu.Lock()
			if !stopped {
				t.Reset(stall - idle)
			}
			mu.Unlock()
			return
		}
		s.h.deps.Metrics.Stalls.Inc()
		// Info, not a warning: a caught-up watch of a resource nothing changes is silent too
		// (docs/design.md section 2), and this cannot tell the two apart.
		s.log.Info("upstream watch silent: nothing, not even a bookmark, for the stall timeout (a hung path, or a resource nothing changes); resuming it",
			zap.String("path", s.client.URL.Path), zap.Stringer("upstream", at.Backend), zap.Duration("silent", idle))
		silentSince.Store(since.UnixNano())
		at.Cancel(errStalled)
	}
	mu.Lock()
	t = s.h.clk.AfterFunc(stall, check)
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
// the end reason.
func (s *session) resume(end attemptEnd) (upstream.Attempt, EndReason) {
	failed := !end.progress && end.resume != ResumeMoved && end.resume != ResumeStall // see run
	var avoid *upstream.Backend
	if end.resume != ResumeEOF || !end.progress {
		avoid = s.backend
	}
	fromRV := s.fix.LastDelivered()
	from, _ := stream.ParseRV(fromRV)
	s.nextSlot = &moveSlot{}
	plan := s.plan(from, s.nextSlot)
	plan.Avoid, plan.Deadline, plan.Backoff, plan.WaitForBackend = avoid, s.giveUpAt, &s.backoff, true
	plan.AfterFailure = failed
	at, err := s.h.deps.Attempts.Do(s.ctx, s.upstreamRequest(false), plan)
	if err != nil {
		if s.ctx.Err() != nil || s.h.stopping() {
			return upstream.Attempt{}, s.endFromContext()
		}
		if !errors.Is(err, upstream.ErrDeadline) { // else the break's own error says more
			end.err = err
		}
		return upstream.Attempt{}, s.giveUp(end)
	}
	resp := at.Resp
	format, ok := stream.FormatOf(resp.Header.Get("Content-Type"))
	switch {
	case resp.StatusCode == http.StatusOK && ok && format == s.format && identity(resp.Header):
		gap := s.h.clk.Since(s.brokeAt)
		s.resumes++
		s.backend = at.Backend
		s.h.deps.Metrics.Resumes.WithLabelValues(end.resume.String()).Inc()
		s.h.deps.Metrics.ResumeSeconds.Observe(gap.Seconds())
		fields := []zap.Field{zap.String("path", s.client.URL.Path), zap.Stringer("reason", end.resume),
			zap.Bool("progress", end.progress), zap.String("fromRV", fromRV), zap.Duration("gap", gap), zap.Stringer("upstream", at.Backend),
			zap.Int("failures", s.backoff.Failures())}
		if end.resume == ResumeMoved {
			fields = append(fields, zap.Stringer("movedBecause", end.move))
		}
		s.log.Info("resumed upstream watch", fields...)
		return at, endNone
	case resp.StatusCode == http.StatusGone:
		st := readStatus(resp)
		at.Cancel(nil)
		return upstream.Attempt{}, s.forceRelist(st)
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests:
		drain(resp) // the Attempter ran out of time retrying these
		at.Cancel(nil)
		end.err = errors.New("upstream answered " + resp.Status)
		return upstream.Attempt{}, s.giveUp(end)
	default:
		s.log.Warn("upstream refused the resumed watch; ending the client's stream cleanly",
			zap.String("path", s.client.URL.Path), zap.Int("code", resp.StatusCode), zap.Stringer("upstream", at.Backend))
		drain(resp)
		at.Cancel(nil)
		return upstream.Attempt{}, EndResumeRefused
	}
}

func (s *session) giveUp(end attemptEnd) EndReason {
	s.log.Warn("could not resume the upstream watch with progress in time; ending the client's stream cleanly",
		zap.String("path", s.client.URL.Path), zap.String("fromRV", s.fix.LastDelivered()),
		zap.Duration("after", s.h.clk.Since(s.brokeAt)), zap.Int("failures", s.backoff.Failures()), zap.Error(end.err))
	return EndResumeTimeout
}

// forceRelist tells the client its resume point is gone: a well-formed ERROR 410 in its format.
func (s *session) forceRelist(st *metav1.Status) EndReason {
	if st == nil || st.Code != http.StatusGone {
		st = &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
			Code: http.StatusGone, Reason: metav1.StatusReasonExpired, Message: "too old resource version: " + s.fix.LastDelivered()}
	}
	if err := s.writer.WriteStatus(st); err == nil {
		_ = s.out.flush()
	}
	s.h.deps.Metrics.RelistsForced.Inc()
	s.log.Info("resume point expired upstream; told the client to relist", zap.String("path", s.client.URL.Path), zap.String("fromRV", s.fix.LastDelivered()))
	return EndRelist
}

func (s *session) endFromContext() EndReason {
	switch cause := context.Cause(s.ctx); {
	case s.client.Context().Err() != nil:
		return EndClientGone
	case errors.Is(cause, errShutdown), s.h.stopping():
		return EndShutdown
	case errors.Is(cause, errClientDeadline):
		return EndDeadline
	}
	return EndClientGone
}

// logEnd writes one line for a stream that needed repairs, with its regressions as a list.
func (s *session) logEnd(reason EndReason) {
	c := s.fix.Counts()
	if c.Rewritten == 0 && c.Dropped == 0 {
		return
	}
	s.log.Warn("upstream watch regressed", zap.String("path", s.client.URL.Path), zap.Stringer("end", reason),
		zap.Uint64("events", c.Events), zap.Uint64("rewritten", c.Rewritten), zap.Uint64("dropped", c.Dropped),
		zap.Uint64("replayedDeletesDropped", c.Remembered), zap.Stringer("mode", s.h.cfg.Mode),
		zap.Array("regressions", regressions(s.fix.Regressions())))
}

type regressions []fix.RegressionDetail

func (rs regressions) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	for _, d := range rs {
		_ = enc.AppendObject(zapcore.ObjectMarshalerFunc(func(o zapcore.ObjectEncoder) error {
			o.AddString("type", d.Type)
			o.AddString("namespace", d.Namespace)
			o.AddString("name", d.Name)
			o.AddString("rv", d.RV)
			o.AddString("last", d.Last)
			o.AddString("action", d.Would.String())
			o.AddString("reason", d.Reason.String())
			if d.NewRV != "" {
				o.AddString("newRV", d.NewRV)
			}
			return nil
		}))
	}
	return nil
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

package watch

import (
	"errors"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/stream"
)

// subscriber is one client response fed by a feed: what the client asked for (its format, its
// bookmarks; its deadline is the feed's for now, see feed), the RV policy on what it is sent
// (its fix.Stream: the initial phase, the resume point, the delete memory scoped by the
// identity the upstream sees), its framing, its batched writes bounded by the write timeout,
// and the counts of what it was sent. It is the feed's sink.
type subscriber struct {
	h      *Handler
	client *http.Request
	log    *watchLog
	// resource is the metrics' label; allowBookmarks, whether the client asked for bookmarks
	// (watchsan asks the upstream always).
	resource       string
	allowBookmarks bool

	w      http.ResponseWriter
	rc     *http.ResponseController
	format stream.Format
	out    batchWriter // what writer writes, batched until the feed would wait
	writer *stream.Writer
	fix    *fix.Stream

	regressed bool
	counters  *eventCounters // the resource's, shared by its watches (Handler.eventCounters)
}

// eventCounters are one resource label's watch event counters by event type index and
// fix.Action, each looked up once (WithLabelValues) when first counted and kept. One table per
// resource label, shared by every watch of it, not one per watch: 18 interface values were
// 288 bytes of every idle watch. A counter goes into the table only once used, so the series
// are the ones counted, as with a table per watch.
type eventCounters struct {
	c [6][3]atomic.Pointer[prometheus.Counter]
}

// eventCounters returns resource's table, made at its first watch. The labels are bounded
// (metrics.Metrics.Resource), and so are the tables.
func (h *Handler) eventCounters(resource string) *eventCounters {
	if t, ok := h.counters.Load(resource); ok {
		return t.(*eventCounters)
	}
	t, _ := h.counters.LoadOrStore(resource, &eventCounters{})
	return t.(*eventCounters)
}

// newSubscriber answers the client's request r on w.
func newSubscriber(h *Handler, w http.ResponseWriter, r *http.Request, p params, resource string, log *watchLog) *subscriber {
	s := &subscriber{h: h, client: r, log: log, resource: resource, allowBookmarks: p.allowBookmarks,
		w: w, rc: http.NewResponseController(w), counters: h.eventCounters(resource)}
	s.out = newBatchWriter(w, s.rc, h.cfg.WriteTimeout)
	return s
}

// start begins the stream in format, the first answer's header copied from hdr, its policy
// fs; the status line and headers go out at once.
func (s *subscriber) start(format stream.Format, hdr http.Header, fs *fix.Stream) {
	s.fix, s.format = fs, format
	copyHeader(s.w.Header(), hdr)
	s.w.Header().Del("Content-Length")
	s.w.WriteHeader(http.StatusOK)
	_ = s.out.flushClient() // an error is sticky: the feed's first read ends the watch with it
	s.writer = stream.NewWriter(format, &s.out)
}

// The resume point, as the policy keeps it (sink).
func (s *subscriber) InInitialPhase() bool  { return s.fix.InInitialPhase() }
func (s *subscriber) LastDelivered() string { return s.fix.LastDelivered() }
func (s *subscriber) HasResumePoint() bool  { return s.fix.HasResumePoint() }

// decide applies the policy to one event and counts what it decided (sink).
func (s *subscriber) decide(ev *stream.Event) fix.Decision {
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
	return d
}

// decideGone is decide for a delete an absorb synthesized (sink).
func (s *subscriber) decideGone(ev *stream.Event) fix.Decision {
	d := s.fix.DecideAbsorbedDelete(ev)
	s.counter(typeIndex(ev.Type), d.Would).Inc()
	return d
}

// write writes an event decide let through, batched (sink).
func (s *subscriber) write(ev *stream.Event, d fix.Decision) error {
	// Bookmarks go only to clients that asked for them (watchsan asks upstream always, to see
	// progress on quiet watches); they still advance the resume point (fix.LastDelivered).
	if ev.Type == stream.Bookmark && !s.allowBookmarks {
		return nil
	}
	if d.Action == fix.Rewrite {
		return s.writer.WriteWithRV(ev, d.RV)
	}
	// Not flushed here: the feed flushes before it waits for its upstream (attemptBody).
	return s.writer.Write(ev)
}

// flush sends what is batched (sink).
func (s *subscriber) flush() error { return s.out.flush() }

// broken says how the client's stream ends after a write to it failed, or endNone (sink).
func (s *subscriber) broken() (EndReason, error) {
	switch {
	case s.out.err == nil:
		return endNone, nil
	case s.out.slow:
		return EndSlowClient, s.out.err
	}
	return EndClientGone, s.out.err
}

// gone says whether the client went away (sink).
func (s *subscriber) gone() bool { return s.client.Context().Err() != nil }

// relist writes st, an ERROR 410, and flushes it (sink).
func (s *subscriber) relist(st *metav1.Status) {
	if err := s.writer.WriteStatus(st); err == nil {
		_ = s.out.flush()
	}
}

// slowClient counts and logs a watch cut because its client did not take a write within the
// write timeout; what (SlowClientReasons) says what it was sent.
func (s *subscriber) slowClient(what string) {
	s.h.deps.Metrics.SlowClients.WithLabelValues(what).Inc()
	s.log.Info("a write to the client did not complete within the write timeout; its watch is cut and its upstream watch closed",
		zap.String("path", s.client.URL.Path), zap.String("what", what), zap.Duration("writeTimeout", s.h.cfg.WriteTimeout))
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

func (s *subscriber) counter(ti int, a fix.Action) prometheus.Counter {
	if int(a) >= 3 {
		a = fix.Pass
	}
	cell := &s.counters.c[ti][a]
	if c := cell.Load(); c != nil {
		return *c
	}
	// Two watches may look it up at once: both get the same counter (WithLabelValues).
	c := s.h.deps.Metrics.WatchEvents.WithLabelValues(s.resource, typeNames[ti], a.String())
	cell.Store(&c)
	return c
}

// logEnd writes one line for a stream that needed repairs, with its regressions as a list.
func (s *subscriber) logEnd(reason EndReason) {
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
	// deadline is the current flush's (on the real clock, as the connection's deadline is,
	// never the Handler's), zero between flushes; slow: a write failed at it (the
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

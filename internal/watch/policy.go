package watch

import (
	"fmt"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/stream"
)

// policy is one watch's resourceVersion policy (package fix: each event passes, is rewritten
// or dropped; the initial phase; the resume point) with the counting and logging of what it
// decides. A private watch's subscriber has its own (subscriber.go); a shared feed has one for
// all its subscribers (share.go), which decides once for every member and answers no client.
// The feed's goroutine owns it, as fix.Stream requires. Every field is written in this file.
type policy struct {
	h   *Handler
	log *watchLog
	// path is the watch's path, in the line and note of a stream that needed repairs (logEnd).
	path string
	// resource is the metrics' label (metrics.Metrics.Resource).
	resource string
	counters *eventCounters // the resource's, shared by its watches (Handler.eventCounters)
	// fix is the policy's state, given once the stream's format is known (begin); nil before,
	// when nothing is decided yet.
	fix *fix.Stream
	// regressed: the watch's first regression was counted (watchsan_watch_regressed_total,
	// once per watch); false: none yet.
	regressed bool
}

// newPolicy is the policy of a watch of path, counted under the metrics label resource; its
// state comes with begin.
func newPolicy(h *Handler, path, resource string, log *watchLog) policy {
	return policy{h: h, log: log, path: path, resource: resource, counters: h.eventCounters(resource)}
}

// begin gives the policy its state, made once the stream's format is known.
func (p *policy) begin(fs *fix.Stream) { p.fix = fs }

// The resume point, as the policy keeps it (sink).
func (p *policy) InInitialPhase() bool  { return p.fix.InInitialPhase() }
func (p *policy) LastDelivered() string { return p.fix.LastDelivered() }
func (p *policy) HasResumePoint() bool  { return p.fix.HasResumePoint() }

// decide applies the policy to one event and counts what it decided (sink).
func (p *policy) decide(ev *stream.Event) fix.Decision {
	d := p.fix.Decide(ev)
	m := p.h.deps.Metrics
	if d.Would != fix.Pass && !p.regressed {
		p.regressed = true // counted at the first regression, so a long watch shows up at once
		m.WatchRegressed.WithLabelValues(p.resource).Inc()
	}
	ti := typeIndex(ev.Type)
	p.counter(ti, d.Would).Inc()
	if d.Reason == fix.ReasonNotInteger {
		m.NonIntegerRVs.WithLabelValues(p.resource).Inc()
	}
	if ce := p.log.Check(zapcore.DebugLevel, "event"); ce != nil {
		ce.Write(zap.String("type", ev.Type), zap.String("rv", ev.RV), zap.String("name", ev.Name),
			zap.Stringer("action", d.Would), zap.Stringer("reason", d.Reason), zap.String("newRV", d.RV))
	}
	return d
}

// decideGone is decide for a delete an absorb synthesized (sink).
func (p *policy) decideGone(ev *stream.Event) fix.Decision {
	d := p.fix.DecideAbsorbedDelete(ev)
	p.counter(typeIndex(ev.Type), d.Would).Inc()
	return d
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

var typeNames = [...]string{stream.Added, stream.Modified, stream.Deleted, stream.Bookmark, stream.Error, "other"}

func typeIndex(t string) int {
	for i, n := range typeNames[:5] {
		if t == n {
			return i
		}
	}
	return 5
}

func (p *policy) counter(ti int, a fix.Action) prometheus.Counter {
	if int(a) >= 3 {
		a = fix.Pass
	}
	cell := &p.counters.c[ti][a]
	if c := cell.Load(); c != nil {
		return *c
	}
	// Two watches may look it up at once: both get the same counter (WithLabelValues).
	c := p.h.deps.Metrics.WatchEvents.WithLabelValues(p.resource, typeNames[ti], a.String())
	cell.Store(&c)
	return c
}

// logEnd writes one line for a stream that needed repairs, with its regressions as a list.
func (p *policy) logEnd(reason EndReason) {
	c := p.fix.Counts()
	if c.Rewritten == 0 && c.Dropped == 0 {
		return
	}
	p.h.note("rewrite", nil, p.path, fmt.Sprintf("%d events, %d rewritten, %d dropped (%s)", c.Events, c.Rewritten, c.Dropped, p.h.cfg.Mode))
	p.log.Warn("upstream watch regressed", zap.String("path", p.path), zap.Stringer("end", reason),
		zap.Uint64("events", c.Events), zap.Uint64("rewritten", c.Rewritten), zap.Uint64("dropped", c.Dropped),
		zap.Uint64("replayedDeletesDropped", c.Remembered), zap.Stringer("mode", p.h.cfg.Mode),
		zap.Array("regressions", regressions(p.fix.Regressions())))
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

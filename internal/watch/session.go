package watch

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/upstream"
)

// session is one client watch.
type session struct {
	h        *Handler
	w        http.ResponseWriter
	rc       *http.ResponseController
	client   *http.Request
	ctx      context.Context // ends with the client, its deadline, or shutdown (with a cause)
	params   params
	resource string
	deadline time.Time // the client's timeoutSeconds; zero: none
	log      *zap.Logger

	format  stream.Format
	writer  *stream.Writer
	fix     *fix.Stream // nil for exempt resources
	backend *upstream.Backend

	// lastRV is the resume point: the last RV delivered to the client, or a later one a
	// bookmark vouched for. initial is true until the initial phase of a ""/"0" or
	// sendInitialEvents watch has ended (a break then cannot be resumed).
	lastRV  string
	initial bool

	events    uint64
	resumes   int
	regressed bool
	counters  [6][3]prometheus.Counter // by event type index and fix.Action
}

// endReason labels watchsan_watch_stream_ends_total.
const (
	endUpstream      = "upstream-ended"
	endClientGone    = "client-gone"
	endDeadline      = "client-deadline"
	endShutdown      = "shutdown"
	endMalformed     = "upstream-malformed"
	endResumeTimeout = "resume-timeout"
	endResumeRefused = "resume-refused"
	endRelist        = "relist-forced"
	endNoResume      = "upstream-broke"
	endUpstreamError = "upstream-error-event"
)

// attemptEnd is how one upstream attempt ended.
type attemptEnd struct {
	reason string // a resume reason (eof, reset, stall, ...) or an end reason
	final  bool   // the client's stream ends now, reason is an end reason
	err    error
	// silentSince, for a stall, is when the upstream last sent anything: the client's gap
	// began then, not when the stall was detected.
	silentSince time.Time
}

// run pumps the first attempt and every resume until the client's stream ends; it returns the
// end reason.
func (s *session) run(resp *http.Response) string {
	for {
		end := s.pump(resp)
		if end.final {
			return end.reason
		}
		brokeAt := time.Now()
		if !end.silentSince.IsZero() {
			brokeAt = end.silentSince
		}
		if s.h.cfg.DisableResume || s.initial || s.lastRV == "" {
			s.log.Info("upstream watch ended; ending the client's stream so it re-watches",
				zap.String("path", s.client.URL.Path), zap.String("why", end.reason), zap.Bool("initialPhase", s.initial), zap.Error(end.err))
			return endNoResume
		}
		var final string
		resp, final = s.resume(end, brokeAt)
		if resp == nil {
			return final
		}
	}
}

// pump reads one upstream response until it ends, writing what the policy lets through.
func (s *session) pump(resp *http.Response) attemptEnd {
	attemptCtx := resp.Request.Context()
	defer resp.Body.Close()
	if cancel := cancelOf(resp); cancel != nil {
		defer cancel(nil)
	}

	var activity atomic.Int64
	activity.Store(time.Now().UnixNano())
	stopWatchdog := s.watchdog(attemptCtx, &activity, resp)
	defer stopWatchdog()

	rd := stream.NewReader(s.format, resp.Body, s.h.cfg.MaxFrameSize)
	for {
		ev, err := rd.Next()
		if err != nil {
			end := s.classify(attemptCtx, err)
			if end.reason == "stall" {
				end.silentSince = time.Unix(0, activity.Load())
			}
			return end
		}
		activity.Store(time.Now().UnixNano())
		s.events++
		if werr := s.deliver(ev); werr != nil {
			return attemptEnd{reason: endClientGone, final: true, err: werr}
		}
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
		s.h.Metrics.RelistsForced.Inc()
		s.log.Info("upstream said the watch's resourceVersion is gone; the client relists",
			zap.String("path", s.client.URL.Path), zap.String("fromRV", s.lastRV), zap.String("message", st.Message))
		return attemptEnd{reason: endRelist, final: true}
	}
	s.log.Info("upstream ended the watch with an ERROR event", zap.String("path", s.client.URL.Path), zap.Error(err))
	return attemptEnd{reason: endUpstreamError, final: true}
}

// deliver applies the policy to one event and writes it (or not).
func (s *session) deliver(ev *stream.Event) error {
	d := fix.Decision{}
	if s.fix != nil {
		d = s.fix.Decide(ev)
	}
	if d.Would != fix.Pass && !s.regressed {
		s.regressed = true // counted at the first regression, so a long watch shows up at once
		s.h.Metrics.WatchRegressed.WithLabelValues(s.resource).Inc()
	}
	ti := typeIndex(ev.Type)
	s.counter(ti, d.Would).Inc()
	if d.Reason == fix.ReasonNotInteger {
		s.h.Metrics.NonIntegerRVs.WithLabelValues(s.resource).Inc()
	}
	if ce := s.log.Check(zapcore.DebugLevel, "event"); ce != nil {
		ce.Write(zap.String("type", ev.Type), zap.String("rv", ev.RV), zap.String("name", ev.Name),
			zap.String("action", d.Would.String()), zap.String("reason", d.Reason.String()), zap.String("newRV", d.RV))
	}
	// Bookmarks go only to clients that asked for them (watchsan asks upstream always, to see
	// progress on quiet watches); they still advance the resume point.
	hidden := ev.Type == stream.Bookmark && !s.params.allowBookmarks
	var err error
	switch {
	case d.Action == fix.Drop:
	case hidden:
	case d.Action == fix.Rewrite:
		err = s.writer.WriteWithRV(ev, d.RV)
	default:
		err = s.writer.Write(ev)
	}
	if err == nil && d.Action != fix.Drop && !hidden {
		err = s.rc.Flush()
	}
	if s.fix != nil {
		s.initial = s.fix.InInitialPhase()
		s.lastRV = s.fix.LastDelivered()
		return err
	}
	// An exempt resource: the same phase rule as fix's, and every RV delivered is the resume
	// point (the Event's strings are its own, safe to keep).
	if s.initial && (ev.InitialEventsEnd || (ev.Type != stream.Added && ev.Type != stream.Bookmark && ev.Type != stream.Error)) {
		s.initial = false
	}
	if ev.RV != "" && ev.Type != stream.Error {
		s.lastRV = ev.RV
	}
	return err
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
		c = s.h.Metrics.WatchEvents.WithLabelValues(s.resource, typeNames[ti], a.String())
		s.counters[ti][a] = c
	}
	return c
}

// classify sorts an attempt's ending: the context's cause first (client, deadline, shutdown,
// stall), then the read error (clean EOF, a broken connection, garbage).
func (s *session) classify(attemptCtx context.Context, err error) attemptEnd {
	if s.client.Context().Err() != nil {
		return attemptEnd{reason: endClientGone, final: true}
	}
	switch cause := context.Cause(attemptCtx); {
	case errors.Is(cause, errShutdown):
		return attemptEnd{reason: endShutdown, final: true}
	case errors.Is(cause, errClientDeadline):
		return attemptEnd{reason: endDeadline, final: true}
	case errors.Is(cause, errStalled):
		return attemptEnd{reason: "stall", err: err}
	}
	switch {
	case errors.Is(err, io.EOF):
		if !s.deadline.IsZero() && time.Until(s.deadline) < time.Second {
			return attemptEnd{reason: endDeadline, final: true}
		}
		return attemptEnd{reason: "eof"}
	case errors.Is(err, stream.ErrFrameTooLarge), errors.Is(err, stream.ErrMalformed):
		s.log.Warn("garbage from upstream; ending the client's stream cleanly",
			zap.String("path", s.client.URL.Path), zap.Stringer("upstream", s.backend), zap.Error(err))
		return attemptEnd{reason: endMalformed, final: true, err: err}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return attemptEnd{reason: "truncated", err: err}
	default:
		return attemptEnd{reason: "reset", err: err}
	}
}

// watchdog probes the upstream when its watch has been silent for the stall timeout; a failed
// probe cancels the attempt (cause errStalled), an answer means the watch is only quiet.
func (s *session) watchdog(ctx context.Context, activity *atomic.Int64, resp *http.Response) (stop func()) {
	cancel := cancelOf(resp)
	if cancel == nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		stall := s.h.cfg.StallTimeout
		t := time.NewTimer(stall)
		defer t.Stop()
		var quietAt time.Time // the last probe that found the upstream answering
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			last := time.Unix(0, activity.Load())
			if quietAt.After(last) {
				last = quietAt
			}
			idle := time.Since(last)
			if idle < stall {
				t.Reset(stall - idle)
				continue
			}
			b := upstream.BackendOf(resp.Request)
			if b == nil {
				b = s.backend
			}
			if err := b.Probe(ctx, s.h.cfg.ProbeTimeout); err != nil && ctx.Err() == nil {
				s.h.Metrics.Stalls.Inc()
				s.log.Warn("upstream watch stalled: no event and the upstream does not answer a probe",
					zap.String("path", s.client.URL.Path), zap.Stringer("upstream", b), zap.Duration("silent", idle), zap.Error(err))
				cancel(errStalled)
				return
			}
			quietAt = time.Now() // only quiet; look again after another period
			t.Reset(stall)
		}
	}()
	return func() { close(done) }
}

// resume opens the watch again from the last delivered RV, on another backend when there is
// one, until it succeeds, the resume timeout passes, or the client's stream must end. It
// returns the new response, or nil and the end reason.
func (s *session) resume(end attemptEnd, brokeAt time.Time) (*http.Response, string) {
	deadline := brokeAt.Add(s.h.cfg.ResumeTimeout)
	failed := s.backend
	for attempt := 0; ; attempt++ {
		if attempt > 0 || end.reason != "eof" {
			wait := resumeBackoff(attempt)
			if time.Now().Add(wait).After(deadline) {
				s.log.Warn("could not resume the upstream watch in time; ending the client's stream cleanly",
					zap.String("path", s.client.URL.Path), zap.String("fromRV", s.lastRV), zap.Duration("after", time.Since(brokeAt)))
				return nil, endResumeTimeout
			}
			if err := s.h.sleep(s.ctx, wait); err != nil {
				return nil, s.endFromContext()
			}
		}
		if s.ctx.Err() != nil {
			return nil, s.endFromContext()
		}
		b := s.h.Pool.PickExcept(failed)
		req := s.upstreamRequest(s.lastRV, false)
		cancel, _ := req.Context().Value(cancelKey{}).(context.CancelCauseFunc)
		req.URL = b.Target(req.URL)
		req.Host = ""
		resp, err := b.RoundTrip(req)
		if err != nil {
			cancel(nil)
			if s.ctx.Err() != nil {
				return nil, s.endFromContext()
			}
			failed = b
			s.log.Debug("resume attempt failed", zap.Stringer("upstream", b), zap.Error(err))
			continue
		}
		format, ok := stream.FormatOf(resp.Header.Get("Content-Type"))
		switch {
		case resp.StatusCode == http.StatusOK && ok && format == s.format && identity(resp.Header):
			gap := time.Since(brokeAt)
			s.resumes++
			s.backend = b
			s.h.Metrics.Resumes.WithLabelValues(end.reason).Inc()
			s.h.Metrics.ResumeSeconds.Observe(gap.Seconds())
			s.log.Info("resumed upstream watch", zap.String("path", s.client.URL.Path), zap.String("reason", end.reason),
				zap.String("fromRV", s.lastRV), zap.Duration("gap", gap), zap.Stringer("upstream", b), zap.Int("attempts", attempt+1))
			return resp, ""
		case resp.StatusCode == http.StatusGone:
			st := readStatus(resp)
			cancel(nil)
			return nil, s.forceRelist(st)
		case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests:
			drain(resp)
			cancel(nil)
			failed = b
			continue
		default:
			s.log.Warn("upstream refused the resumed watch; ending the client's stream cleanly",
				zap.String("path", s.client.URL.Path), zap.Int("code", resp.StatusCode), zap.Stringer("upstream", b))
			drain(resp)
			cancel(nil)
			return nil, endResumeRefused
		}
	}
}

// forceRelist tells the client its resume point is gone: a well-formed ERROR 410 in its format.
func (s *session) forceRelist(st *metav1.Status) string {
	if st == nil || st.Code != http.StatusGone {
		st = &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
			Code: http.StatusGone, Reason: metav1.StatusReasonExpired, Message: "too old resource version: " + s.lastRV}
	}
	if err := s.writer.WriteStatus(st); err == nil {
		_ = s.rc.Flush()
	}
	s.h.Metrics.RelistsForced.Inc()
	s.log.Info("resume point expired upstream; told the client to relist", zap.String("path", s.client.URL.Path), zap.String("fromRV", s.lastRV))
	return endRelist
}

func (s *session) endFromContext() string {
	switch cause := context.Cause(s.ctx); {
	case s.client.Context().Err() != nil:
		return endClientGone
	case errors.Is(cause, errShutdown):
		return endShutdown
	case errors.Is(cause, errClientDeadline):
		return endDeadline
	}
	return endClientGone
}

func (s *session) logEnd(reason string) {
	if s.fix == nil {
		return
	}
	c := s.fix.Counts()
	if c.Rewritten == 0 && c.Dropped == 0 {
		return
	}
	details := s.fix.Regressions()
	fields := []zap.Field{zap.String("path", s.client.URL.Path), zap.String("end", reason), zap.Uint64("events", c.Events),
		zap.Uint64("rewritten", c.Rewritten), zap.Uint64("dropped", c.Dropped), zap.Uint64("replayedDeletesDropped", c.Remembered),
		zap.String("mode", s.h.mode.String())}
	for i, d := range details {
		fields = append(fields, zap.String("regression"+strconv.Itoa(i), d.Type+" "+d.Namespace+"/"+d.Name+" rv="+d.RV+
			" last="+d.Last+" -> "+d.Would.String()+"("+d.Reason.String()+")"+newRV(d.NewRV)))
	}
	s.log.Warn("upstream watch regressed", fields...)
}

func newRV(rv string) string {
	if rv == "" {
		return ""
	}
	return " rv=" + rv
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

// resumeBackoff: 50ms doubling to 2s, +-25% jitter.
func resumeBackoff(attempt int) time.Duration {
	d := 50 * time.Millisecond << min(attempt, 6)
	if d > 2*time.Second {
		d = 2 * time.Second
	}
	return d*3/4 + time.Duration(rand.Int64N(int64(d/2)+1))
}

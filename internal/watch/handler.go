// Package watch serves one client watch from top to bottom: it owns the upstream side (the
// first attempt, and every resume after the upstream breaks), reads the upstream's events with
// internal/stream, lets internal/fix decide each one, and writes the result into the one client
// response, flushed per event. How a client watch may end (DESIGN.md section 5):
//   - cleanly (the client re-watches from its last RV): shutdown, the client's timeoutSeconds,
//     resume given up, garbage from upstream;
//   - with a well-formed ERROR 410 event (the client relists): the resume point is gone;
//   - never with a second status line, and never with a partial event.
package watch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/watchsan/watchsan/internal/apistatus"
	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/metrics"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/upstream"
)

// Config tunes every watch. Zero values take the defaults noted.
type Config struct {
	// FixMode is "repair" (default) or "observe".
	FixMode string
	// Exempt lists resources ("pods", "apps/deployments") whose events pass unsanitized.
	Exempt []string
	// MaxFrameSize bounds one upstream event; 0: stream.DefaultMaxFrameSize.
	MaxFrameSize int
	// DeleteMemoryEntries and DeleteMemoryTTL bound the rewritten-delete memory; 0: 100000 and 30m.
	DeleteMemoryEntries int
	DeleteMemoryTTL     time.Duration
	// ResumeTimeout bounds the resume attempts after one break; 0: 60s.
	ResumeTimeout time.Duration
	// StallTimeout is the silence after which the upstream is probed; 0: 90s.
	StallTimeout time.Duration
	// ProbeTimeout bounds the stall probe; 0: 5s.
	ProbeTimeout time.Duration
	// DisableResume ends the client's watch when the upstream's breaks.
	DisableResume bool
}

// Handler serves watch requests. Set the exported fields before the first request.
type Handler struct {
	// Upstream sends the first attempt of every watch, with its pre-response retries.
	Upstream *upstream.Retrier
	// Pool picks the backend of a resume attempt (another one than the broken one when it can).
	Pool *upstream.Pool
	// Metrics counts events, resumes and endings; required.
	Metrics *metrics.Metrics
	// Done, when closed, ends every watch cleanly (shutdown). Nil: never.
	Done <-chan struct{}
	// Sleep waits between resume attempts; nil: a timer honouring ctx (tests may shorten it).
	Sleep func(ctx context.Context, d time.Duration) error

	cfg    Config
	mode   fix.Mode
	memory *fix.DeleteMemory
	exempt map[string]bool
	log    *zap.Logger
}

// New validates cfg and builds a Handler.
func New(cfg Config, log *zap.Logger) (*Handler, error) {
	if cfg.FixMode == "" {
		cfg.FixMode = "repair"
	}
	mode, err := fix.ParseMode(cfg.FixMode)
	if err != nil {
		return nil, err
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.DeleteMemoryTTL, 30*time.Minute)
	def(&cfg.ResumeTimeout, 60*time.Second)
	def(&cfg.StallTimeout, 90*time.Second)
	def(&cfg.ProbeTimeout, 5*time.Second)
	if cfg.DeleteMemoryEntries == 0 {
		cfg.DeleteMemoryEntries = 100000
	}
	if cfg.MaxFrameSize <= 0 {
		cfg.MaxFrameSize = stream.DefaultMaxFrameSize
	}
	h := &Handler{cfg: cfg, mode: mode, log: log.Named("watch"), exempt: map[string]bool{}}
	h.memory = fix.NewDeleteMemory(cfg.DeleteMemoryEntries, cfg.DeleteMemoryTTL, nil)
	for _, r := range cfg.Exempt {
		h.exempt[r] = true
	}
	return h, nil
}

// DeleteMemoryLen reports the remembered deletes (a metrics gauge).
func (h *Handler) DeleteMemoryLen() float64 { return float64(h.memory.Len()) }

// Causes that end an attempt's context; the session sorts endings by them.
var (
	errShutdown       = errors.New("watchsan is shutting down")
	errClientDeadline = errors.New("the client's timeoutSeconds passed")
	errStalled        = errors.New("upstream watch stalled")
)

// params are the watch parameters that matter to watchsan.
type params struct {
	rv                string
	sendInitialEvents bool
	allowBookmarks    bool
	timeout           time.Duration // 0: none given
}

func parseParams(r *http.Request) params {
	q := r.URL.Query()
	p := params{rv: q.Get("resourceVersion")}
	p.sendInitialEvents, _ = strconv.ParseBool(q.Get("sendInitialEvents"))
	p.allowBookmarks, _ = strconv.ParseBool(q.Get("allowWatchBookmarks"))
	if s, err := strconv.ParseInt(q.Get("timeoutSeconds"), 10, 64); err == nil && s > 0 {
		p.timeout = time.Duration(s) * time.Second
	}
	return p
}

// scopeOf identifies a watch for the rewritten-delete memory: what it selects, and who asks (a
// digest of the credentials, never the credentials), so one client's remembered deletes never
// suppress a delete another client has not seen.
func scopeOf(r *http.Request) string {
	q := r.URL.Query()
	path := strings.Replace(r.URL.Path, "/watch/", "/", 1)
	who := sha256.Sum256([]byte(r.Header.Get("Authorization")))
	return path + "?l=" + q.Get("labelSelector") + "&f=" + q.Get("fieldSelector") + "&a=" + hex.EncodeToString(who[:8])
}

// ServeHTTP serves one watch request, classifying it first.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.Serve(w, r, reqinfo.Parse(r)) }

// Serve serves one watch request that info (reqinfo.Parse(r)) classifies.
func (h *Handler) Serve(w http.ResponseWriter, r *http.Request, info reqinfo.Info) {
	p := parseParams(r)
	resource := h.Metrics.Resource(info.FullResource())

	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	var deadline time.Time
	if p.timeout > 0 {
		deadline = time.Now().Add(p.timeout)
		t := time.AfterFunc(p.timeout, func() { cancel(errClientDeadline) })
		defer t.Stop()
	}
	if h.Done != nil {
		go func() { // exits when the watch ends: ctx is cancelled on return
			select {
			case <-h.Done:
				cancel(errShutdown)
			case <-ctx.Done():
			}
		}()
	}

	s := &session{
		h: h, w: w, rc: http.NewResponseController(w), client: r, ctx: ctx, params: p,
		resource: resource, deadline: deadline, log: h.log,
	}
	first, err := h.Upstream.RoundTrip(s.upstreamRequest(p.rv, true))
	if err != nil {
		if r.Context().Err() != nil {
			return
		}
		st := apistatus.ForUpstreamError(upstream.Name(err), err)
		if errors.Is(context.Cause(ctx), errShutdown) {
			st = apistatus.New(http.StatusServiceUnavailable, "ServiceUnavailable", "watchsan is shutting down")
		}
		h.log.Warn("watch: upstream failed before the response started", zap.String("path", r.URL.Path), zap.Error(err))
		apistatus.Write(w, st)
		return
	}
	s.backend = upstream.BackendOf(first.Request)
	format, ok := stream.FormatOf(first.Header.Get("Content-Type"))
	if first.StatusCode != http.StatusOK || !ok || !identity(first.Header) {
		// Not a stream we can read (an error status, a content type we do not parse): relay.
		relay(w, s.rc, first)
		return
	}
	if !h.exempt[info.GroupResource()] {
		s.fix = fix.NewStream(fix.Options{
			Scope: scopeOf(r), StartRV: p.rv, SendInitialEvents: p.sendInitialEvents,
			Mode: h.mode, Memory: h.memory,
		})
	}
	s.format = format
	s.lastRV = p.rv
	s.initial = p.rv == "" || p.rv == "0" || p.sendInitialEvents
	copyHeader(w.Header(), first.Header)
	w.Header().Del("Content-Length")
	w.WriteHeader(http.StatusOK)
	_ = s.rc.Flush()
	s.writer = stream.NewWriter(format, w)

	h.Metrics.OpenWatches.WithLabelValues(resource).Inc()
	defer h.Metrics.OpenWatches.WithLabelValues(resource).Dec()
	reason := s.run(first)
	h.Metrics.StreamEnds.WithLabelValues(reason).Inc()
	if ce := s.log.Check(zapcore.DebugLevel, "watch ended"); ce != nil {
		ce.Write(zap.String("path", r.URL.Path), zap.String("reason", reason), zap.Uint64("events", s.events),
			zap.Int("resumes", s.resumes), zap.String("lastRV", s.lastRV))
	}
	s.logEnd(reason)
}

func identity(h http.Header) bool {
	ce := h.Get("Content-Encoding")
	return ce == "" || ce == "identity"
}

// hopHeaders are connection-level headers never relayed (RFC 9110 7.6.1).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func copyHeader(dst, src http.Header) {
	for k, vv := range src {
		dst[k] = append([]string(nil), vv...)
	}
	for _, k := range hopHeaders {
		dst.Del(k)
	}
	for _, f := range src.Values("Connection") {
		for _, k := range strings.Split(f, ",") {
			dst.Del(strings.TrimSpace(k))
		}
	}
}

// relay copies a response as it is, flushing each read.
func relay(w http.ResponseWriter, rc *http.ResponseController, resp *http.Response) {
	defer resp.Body.Close()
	copyHeader(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			_ = rc.Flush()
		}
		if err != nil {
			return
		}
	}
}

// forwardedFor is the client's address for X-Forwarded-For.
func forwardedFor(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

func (h *Handler) sleep(ctx context.Context, d time.Duration) error {
	if h.Sleep != nil {
		return h.Sleep(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("waiting to resume: %w", context.Cause(ctx))
	case <-t.C:
		return nil
	}
}

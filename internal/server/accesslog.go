package server

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/watchsan/watchsan/internal/metrics"
	"github.com/watchsan/watchsan/internal/upstream"
)

// recorder remembers the status and body size of a response. It unwraps for
// http.ResponseController, so flushing and hijacking (upgrades) reach the real writer.
type recorder struct {
	http.ResponseWriter
	code  int
	bytes int64
	in    *instrumented // what Detach defers the end of; nil: not serveInstrumented's
}

func (r *recorder) WriteHeader(code int) {
	if r.code == 0 || r.code == http.StatusContinue || r.code == http.StatusEarlyHints {
		r.code = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	n, err := r.ResponseWriter.Write(p)
	r.bytes += int64(n)
	return n, err
}

func (r *recorder) Flush() { _ = http.NewResponseController(r.ResponseWriter).Flush() }

func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(r.ResponseWriter).Hijack()
	if err == nil && r.code == 0 {
		r.code = http.StatusSwitchingProtocols
	}
	return c, brw, err
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// Detach (watch.Detacher): the watch took its connection and its stream outlives the route
// (a shared feed's subscriber on HTTP/1.1, docs/design.md section 11). The request's end (its
// access log line, its metrics, the in-flight gauge) then comes when the stream's does, with
// the bytes it wrote. Meanwhile nothing keeps net/http's response (and its connection's
// buffers) reachable: the line's Audit-Id is taken now.
func (r *recorder) Detach() func(written int64) {
	in := r.in
	if in == nil {
		return nil
	}
	in.detached = true
	in.auditID = r.Header().Get("Audit-Id")
	in.r = loggedRequest(in.r)
	in.pending.Add(1)
	return func(written int64) {
		r.bytes += written
		in.release()
	}
}

// statusClientClosed is the code a request is counted and logged under when its client went
// away before any answer: nginx's 499 ("client closed request"), not the 200 net/http would
// have sent (a rapid-reset run counted 19,456 requests as 200, 8,126 of which had
// reached the upstream and none of which was answered).
const statusClientClosed = 499

// serveInstrumented serves r with next, then writes the access log line and the request
// metrics. The log never carries a header value: tokens live there. What it keeps for the
// end is one heap object (instrumented), so that its own frame stays small: a watch parks
// its goroutine, this frame among its callers', for the watch's whole life
// (watch.Handler.Serve).
func (s *Server) serveInstrumented(w http.ResponseWriter, r *http.Request, c *classified, next route) {
	in := s.instrument(w, r, c)
	defer in.routeDone()
	next(&in.rec, in.r, c)
}

// instrumented is one request served by serveInstrumented: what its end counts and logs.
type instrumented struct {
	s     *Server
	start time.Time
	rec   recorder
	c     *classified
	r     *http.Request // as the route got it
	body  *countingBody // nil: the request had no body
	// pending counts what the end waits for: the route's return, and a detached watch's end
	// (recorder.Detach), which may come first.
	pending atomic.Int32
	// detached: the route's watch detached (recorder.Detach), auditID taken then.
	detached bool
	auditID  string
}

// routeDone: the route returned. A detached watch's ResponseWriter is let go now (the route
// wrote its last through it), before the count that lets its stream's end write the line.
func (in *instrumented) routeDone() {
	if in.detached {
		in.rec.ResponseWriter = nil
	}
	in.release()
}

// release ends the request once both the route and a detached stream are done.
func (in *instrumented) release() {
	if in.pending.Add(-1) == 0 {
		in.done()
	}
}

// instrument starts serving r: it counts it in flight, and wraps its body to count it.
func (s *Server) instrument(w http.ResponseWriter, r *http.Request, c *classified) *instrumented {
	in := &instrumented{s: s, start: time.Now(), rec: recorder{ResponseWriter: w}, c: c, r: r}
	in.rec.in = in
	in.pending.Store(1)
	s.metrics.InFlight.Inc()
	if r.Body != nil && r.Body != http.NoBody {
		in.body = &countingBody{ReadCloser: r.Body}
		in.r = r.WithContext(r.Context()) // a shallow copy: the incoming request stays as it came
		in.r.Body = in.body
	}
	return in
}

// done writes the access log line and the request metrics once the route returned.
func (in *instrumented) done() {
	s, r, c, rec := in.s, in.r, in.c, &in.rec
	if in.body != nil {
		s.metrics.Bytes.WithLabelValues("client_to_upstream").Add(float64(in.body.n.Load()))
	}
	info := c.info
	resource := info.FullResource()
	s.metrics.InFlight.Dec()
	code := rec.code
	switch {
	case code == 0 && r.Context().Err() != nil:
		code = statusClientClosed // no answer went out, and none will: the client left
	case code == 0:
		code = http.StatusOK // what net/http sends for a handler that wrote nothing
	}
	d := time.Since(in.start)
	if (code >= 200 && code < 300 || code == http.StatusSwitchingProtocols) && c.ref == nil {
		s.metrics.Seen(resource) // the upstream served it: a real resource
	}
	res, verb := s.metrics.Resource(resource), metrics.Verb(info.Verb)
	s.metrics.Requests.WithLabelValues(verb, res, strconv.Itoa(code)).Inc()
	if info.Verb != "watch" && code != http.StatusSwitchingProtocols {
		s.metrics.RequestSeconds.WithLabelValues(verb, res).Observe(d.Seconds())
	}
	s.metrics.Bytes.WithLabelValues("upstream_to_client").Add(float64(rec.bytes))
	if ce := s.accessLog.Check(zapcore.InfoLevel, "request"); ce != nil {
		ce.Write(
			zap.String("verb", info.Verb),
			zap.String("resource", resource),
			zap.String("namespace", info.Namespace),
			zap.String("name", info.Name),
			zap.String("path", r.URL.Path),
			zap.Int("code", code),
			zap.Duration("duration", d),
			zap.Int64("bytes", rec.bytes),
			zap.String("remote", r.RemoteAddr),
			zap.String("requestID", c.id),
			zap.String("route", c.route),
			zap.String("userAgent", r.UserAgent()),
			// who the apiserver takes it for (docs/design.md section 11): the kind of
			// credentials, a digest naming them (never a credential), and a verified
			// certificate's user and groups when they are asserted
			zap.Stringer("credentials", c.cred),
			zap.String("principal", c.cred.Principal()),
			zap.Inline(assertedUser(c.cred)),
			// the apiserver's id of the request in its audit log (every attempt's answer
			// carries one; this is the one relayed)
			zap.String("auditID", in.auditIDOf()),
		)
	}
}

// assertedUser logs the user and groups of an asserted certificate identity; nothing otherwise.
type assertedUser upstream.Credentials

func (a assertedUser) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	if id, ok := upstream.Credentials(a).Asserted(); ok {
		enc.AddString("user", id.User)
		return enc.AddArray("groups", zapcore.ArrayMarshalerFunc(func(ae zapcore.ArrayEncoder) error {
			for _, g := range id.Groups {
				ae.AppendString(g)
			}
			return nil
		}))
	}
	return nil
}

// countingBody counts the request body bytes read (by the proxy, towards the upstream).
// The transport reads it from its own goroutine, hence the atomic.
type countingBody struct {
	io.ReadCloser
	n atomic.Int64
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// auditIDOf is the Audit-Id of the response: as relayed, or as it was when the watch detached.
func (in *instrumented) auditIDOf() string {
	if in.detached {
		return in.auditID
	}
	return in.rec.Header().Get("Audit-Id")
}

// loggedRequest is what done reads of r, and nothing else: a detached watch's line is written
// at its end, and r whole (its headers, URL, contexts) was about 1.5 KiB of every idle
// detached watch (docs/bench/NOTES.md). Its context is the background's: the client's leaving
// is the watch's to see, and its code is set.
func loggedRequest(r *http.Request) *http.Request {
	out := &http.Request{Method: r.Method, URL: &url.URL{Path: r.URL.Path}, RemoteAddr: r.RemoteAddr, Header: http.Header{}}
	if ua := r.Header["User-Agent"]; len(ua) > 0 {
		out.Header["User-Agent"] = ua[:1:1]
	}
	return out
}

package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// DefaultRetryBudget bounds the retries of one request when AttempterOptions.Budget is zero.
// It is chosen for a sidecar whose single apiserver restarts: a restart takes seconds, so a
// request that was in flight or arrives just as it goes away waits for it, up to this long
// after the apiserver was last seen healthy; later requests are answered 503 at once, with
// Retry-After, and client-go and kubectl retry those on their own.
const DefaultRetryBudget = 10 * time.Second

// ErrNoBackend is the failure when no backend is usable: all are failing their health checks
// or refusing connections. The client is told to retry after a second (apistatus maps it).
var ErrNoBackend = errors.New("every upstream apiserver is unavailable")

// ErrDeadline is Do's failure when the wait before its first attempt (Plan.AfterFailure) would
// pass Plan.Deadline: no attempt was made.
var ErrDeadline = errors.New("the next attempt would start after the deadline")

// AttempterOptions configure an Attempter. Every field's zero value is usable.
type AttempterOptions struct {
	// Budget bounds the time one request spends in retries; 0: DefaultRetryBudget. A negative
	// budget disables retries (one attempt).
	Budget time.Duration
	// OnRetry, if set, is told "retried", "recovered" (success after a retry) or "exhausted"
	// (budget spent; the last failure returned).
	OnRetry func(outcome string)
	// Done, when closed, stops every wait between attempts: the last answer is returned at
	// once (shutdown: a request waiting out a Retry-After gets that answer, not a cut
	// connection at the shutdown timeout). Nil: never.
	Done <-chan struct{}
	// Clock paces Do: its deadline, its backoff waits and its wait for a usable backend (the
	// watch's loop, on the watch's clock). Nil: the Pool's (PoolOptions.Clock), the real one
	// unless a test gives another.
	Clock clock.Clock
}

// Attempter is the one loop that sends a request upstream: the first attempt of
// every request and of every watch resume goes through Do. It picks a usable backend (another
// one than the one that just failed, when there is one), retries what may be retried with
// exponential backoff and jitter, honours Retry-After, and stops within a deadline. When no
// backend is usable it fails fast with ErrNoBackend, unless waiting is worth it: a backend was
// healthy a moment ago (within the budget), or the caller asked to wait.
//
// What is retried, before any response reached the client:
//   - idempotent requests (GET, HEAD, OPTIONS; watches are GETs) whose body was not read, after
//     any failure to get a response (a broken or unusable connection: "http2: client conn could
//     not be established" after a GOAWAY is one), a 503 (an apiserver shutting down answers so)
//     or a 429;
//   - any other request only when it provably never reached an upstream: the dial failed and
//     not one byte of its body was read.
//
// Below that, the transport itself replays a request the upstream provably did not process (a
// refused stream, a stream above a GOAWAY's last stream ID), whatever its method: every
// attempt's request has GetBody while no more than MaxReplayBody of its body was read
// (countingBody; docs/design.md section 10.7).
type Attempter struct {
	pool *Pool
	opts AttempterOptions
	// sleep waits d or until ctx ends; tests may replace it.
	sleep func(ctx context.Context, d time.Duration) error
}

// NewAttempter returns the attempt loop over pool.
func NewAttempter(pool *Pool, o AttempterOptions) *Attempter {
	if o.Budget == 0 {
		o.Budget = DefaultRetryBudget
	}
	if o.Clock == nil {
		o.Clock = pool.clk
	}
	a := &Attempter{pool: pool, opts: o}
	a.sleep = func(ctx context.Context, d time.Duration) error {
		t := a.opts.Clock.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-a.opts.Done:
			return errStopping
		case <-t.C():
			return nil
		}
	}
	return a
}

var errStopping = errors.New("watchsan is shutting down")

// MaxReplayBody bounds what is kept of a request body so that the transport can send it again
// where the upstream provably did not process it (a refused stream, a stream above a GOAWAY's
// last stream ID: Go's HTTP/2 transport replays those given Request.GetBody, docs/design.md
// section 10.7). 1 MiB holds nearly every object (the apiserver refuses requests above 3 MiB,
// etcd values above 1.5 MiB by default); a request whose transport has read more of its body
// than this is not replayed.
const MaxReplayBody = 1 << 20

// Plan is what one call of Do may do beyond the defaults. The zero value is a request's plan.
type Plan struct {
	// Avoid is tried only when no other backend is usable (it just failed). Nil: none.
	Avoid *Backend
	// Deadline: no attempt starts after it. Zero: now + the budget.
	Deadline time.Time
	// Backoff paces the attempts; the caller may keep it across calls (a watch's resumes),
	// and Reset it after progress, but only Do steps it (Next): the waits of all the calls
	// made with it are one loop (docs/design.md section 5). Nil: a fresh RequestBackoff.
	Backoff *Backoff
	// AfterFailure: the caller's previous attempt with Backoff failed after Do had returned it
	// (a watch resume that delivered nothing): Do waits Backoff's next delay before its first
	// attempt too. When that wait would pass Deadline, Do makes no attempt and fails with
	// ErrDeadline. Ignored with Target.
	AfterFailure bool
	// WaitForBackend waits for a usable backend until Deadline even when none was healthy a
	// moment ago (a watch's resume: the client's stream is held open anyway). False: fail fast.
	WaitForBackend bool

	// Watch marks a watch attempt: it goes to the backend with the fewest open watches, and
	// holds a Lease there (Attempt.Lease) through which the Pool may move it. Otherwise the
	// backend with the fewest outstanding requests is picked.
	Watch bool
	// Scope is a watch's path and selectors: every watch of one scope gets the same events, so
	// one that falls behind the others is lagging. Empty: no lag detection.
	Scope string
	// Resource is a watch's GROUP/RESOURCE (RESOURCE for the core group): the resourceVersions
	// it delivers raise that resource's high-water mark (Pool.HighWater). Empty: none.
	Resource string
	// From is the resourceVersion a watch attempt starts from (its resume point), if known. A
	// backend known unable to serve it (Backend.CanServe) is tried only when no usable one is
	// left that may.
	From uint64
	// MakeBeforeBreak, for a watch, makes its moves make-before-break (docs/design.md section
	// 10.1): the Pool does not end the attempt to move the watch, it asks (Lease.Asked), and
	// the watch's owner opens the target itself, then ends the attempt with Lease.Cut once a
	// target has accepted the watch, or calls Lease.MoveFailed. False: the Pool ends the
	// attempt itself (a MoveError), and the owner resumes it.
	MakeBeforeBreak bool
	// Target, when set, is the one backend tried, once (a move's make-before-break attempt, a
	// probe of a watch's own backend): no other is picked, nothing is retried; refused only
	// when it is unhealthy.
	Target *Backend
	// RetryTooLarge: the request carries a raised resourceVersion (the time-travel guard). A
	// 504 answer (the backend's cache is behind it) marks the backend lagging and is tried on
	// another backend.
	RetryTooLarge bool
	// Credentials are whose credentials every attempt goes with, decided on the client's
	// request (Decide), or Self for watchsan's own; the zero value sends only what the request
	// carries.
	Credentials Credentials
	// Idempotent: the request changes nothing whatever its method (a POST of a
	// SelfSubjectAccessReview, which the apiserver answers without storing anything), so it is
	// retried as a GET is.
	Idempotent bool
}

// servable returns the test of which backends can serve a watch's resume point; nil: any.
func (plan Plan) servable() func(*Backend) bool {
	if !plan.Watch || plan.Resource == "" || plan.From == 0 {
		return nil
	}
	return func(b *Backend) bool { return b.CanServe(plan.Resource, plan.From) }
}

// Attempt is a response obtained by Do and what it came from.
type Attempt struct {
	Resp    *http.Response
	Backend *Backend
	// Lease is a watch attempt's place on Backend (Plan.Watch); nil otherwise. It ends with
	// Cancel.
	Lease *Lease
	// Cancel ends the attempt's context (with a cause, read by context.Cause); call it when done
	// with Resp. It is never nil in an Attempt returned with a nil error.
	Cancel context.CancelCauseFunc
}

// Error is a failure to get a response from Backend.
type Error struct {
	Backend *Backend
	Err     error
}

func (e *Error) Error() string { return e.Backend.String() + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Name returns the backend named by an *Error in err's chain, or "upstream".
func Name(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Backend.String()
	}
	return "upstream"
}

// Do sends req (whose URL holds only the client's path and query; it is not modified) to a
// backend, retrying as the Attempter's rules and plan allow. It returns either an Attempt with a
// response (any status: the last one when retries ran out), or an error (a *Error, ErrNoBackend
// wrapped, or the context's cause): never neither, never both. The request's body, if any, is
// read at most by the attempts that reached an upstream.
func (a *Attempter) Do(ctx context.Context, req *http.Request, plan Plan) (Attempt, error) {
	clk := a.opts.Clock
	now := clk.Now()
	deadline := plan.Deadline
	if deadline.IsZero() {
		deadline = now.Add(max(a.opts.Budget, 0))
	}
	bo := plan.Backoff
	if bo == nil {
		b := RequestBackoff
		bo = &b
	}
	body := newCountingBody(req)
	idempotent := plan.Idempotent || req.Method == http.MethodGet || req.Method == http.MethodHead || req.Method == http.MethodOptions
	if t := plan.Target; t != nil {
		if t.State() == Unhealthy { // a removed one still serves what is asked of it by name
			return Attempt{}, &Error{Backend: t, Err: fmt.Errorf("%w (%s is %s)", ErrNoBackend, t, t.State())}
		}
		return a.send(ctx, req, t, body, plan)
	}
	if plan.AfterFailure {
		wait := bo.Next()
		if now.Add(wait).After(deadline) {
			return Attempt{}, fmt.Errorf("%w (it would wait %v)", ErrDeadline, wait.Round(time.Millisecond))
		}
		if err := a.sleep(ctx, wait); err != nil {
			return Attempt{}, err
		}
	}
	serve := plan.servable()
	avoid := plan.Avoid
	var lastErr error
	for attempt := 0; ; attempt++ {
		b := a.pool.pickServing(plan.Watch, avoid, serve)
		if b == nil {
			if err := a.waitUsable(ctx, plan, deadline); err != nil {
				if ctx.Err() == nil && lastErr != nil {
					err = fmt.Errorf("%w (last: %w)", err, lastErr)
				}
				a.outcome(attempt, "exhausted")
				return Attempt{}, err
			}
			continue
		}
		at, err := a.send(ctx, req, b, body, plan)
		wait, retry := retryable(ctx, idempotent, body, at.Resp, err, plan.RetryTooLarge)
		if err != nil && errors.Is(err, ErrFrozen) {
			// Section 10.8: elsewhere, after the backoff's next delay (the first: about 100 ms),
			// when a repeat is safe; else the client's 503. The backoff goes on: a request cut
			// again on the backend it went to next waits longer, as after any failure.
			unread := body != nil && body.read.Load() == 0 // sent without its body: not processable
			if !retry && !unread && !safeToRepeat(req.Method, req.Header, body.whole()) {
				return Attempt{}, err
			}
			retry, wait = true, 0
		}
		if retry && plan.RetryTooLarge && at.Resp != nil && at.Resp.StatusCode == http.StatusGatewayTimeout {
			a.pool.markLagging(b, a.pool.clk.Now(), "it answered 504 to a list at watchsan's high-water resourceVersion")
		}
		if at.Resp != nil && (at.Resp.StatusCode >= 500 || at.Resp.StatusCode == http.StatusTooManyRequests) {
			a.pool.suspect(b)
		}
		if !retry {
			if err != nil {
				return Attempt{}, err
			}
			a.outcome(attempt, "recovered")
			return at, nil
		}
		wait = max(wait, bo.Next())
		if ctx.Err() != nil || clk.Now().Add(wait).After(deadline) {
			a.outcome(attempt+1, "exhausted")
			if err != nil {
				return Attempt{}, err
			}
			return at, nil // the last answer, a 429 or 503 with its Retry-After, is the client's
		}
		if at.Resp != nil {
			// Kept (a status body is small) in case the wait is cut short by Done.
			at.Resp.Body = bufferBody(at.Resp.Body)
			at.Cancel(nil)
			lastErr = fmt.Errorf("%s answered %d", b, at.Resp.StatusCode)
		} else {
			lastErr = err
		}
		if a.stopping() {
			return a.last(at, err)
		}
		a.outcome(1, "retried")
		avoid = b
		if serr := a.sleep(ctx, wait); serr != nil {
			if ctx.Err() == nil && a.stopping() {
				return a.last(at, err)
			}
			return Attempt{}, fmt.Errorf("%w (last: %w)", serr, lastErr)
		}
	}
}

// waitUsable waits until some backend is usable. It fails with ErrNoBackend at once unless the
// plan waits for backends, or a backend was healthy less than the budget ago (then it waits at
// most until the budget after that moment); it always stops at deadline.
func (a *Attempter) waitUsable(ctx context.Context, plan Plan, deadline time.Time) error {
	clk := a.opts.Clock
	noBackend := func() error { return fmt.Errorf("%w (%s)", ErrNoBackend, a.pool.describe()) }
	// healthyUntil is on the Pool's clock (when a backend was last healthy), deadline on Do's:
	// each is compared with its own clock's now, and only the durations left are mixed.
	var healthyUntil time.Time
	if !plan.WaitForBackend {
		since := a.pool.healthySince()
		if since.IsZero() || a.opts.Budget <= 0 {
			return noBackend()
		}
		healthyUntil = since.Add(a.opts.Budget)
	}
	for {
		changed := a.pool.changes()
		if a.pool.pick(plan.Watch, nil) != nil {
			return nil
		}
		left := deadline.Sub(clk.Now())
		if !healthyUntil.IsZero() {
			left = min(left, healthyUntil.Sub(a.pool.clk.Now()))
		}
		if left <= 0 {
			return noBackend()
		}
		t := clk.NewTimer(left)
		select {
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-changed:
			t.Stop()
		case <-t.C():
			return noBackend()
		}
	}
}

// stopping reports whether Done is closed.
func (a *Attempter) stopping() bool {
	select {
	case <-a.opts.Done:
		return true
	default:
		return false
	}
}

// last returns an attempt's outcome as Do's answer.
func (a *Attempter) last(at Attempt, err error) (Attempt, error) {
	if err != nil {
		return Attempt{}, err
	}
	return at, nil
}

func (a *Attempter) send(ctx context.Context, req *http.Request, b *Backend, body *countingBody, plan Plan) (Attempt, error) {
	actx, cancelCtx := context.WithCancelCause(ctx)
	// The attempt counts toward b's load from now until Cancel: a watch as a lease, anything
	// else as an outstanding request.
	var lease *Lease
	var ended atomic.Bool
	cancel := func(cause error) {
		if !ended.Swap(true) {
			if lease != nil {
				lease.release()
			} else {
				b.inflight.Add(-1)
			}
		}
		cancelCtx(cause)
	}
	if plan.Watch {
		lease = a.pool.newLease(b, plan, cancelCtx)
	} else {
		b.inflight.Add(1)
	}
	out := req.Clone(actx)
	out.URL = b.Target(req.URL)
	out.Host = ""
	out.RequestURI = ""
	if body != nil {
		out.Body, out.GetBody = body.open()
	}
	// A short request is cut at once if b is found unhealthy meanwhile; any attempt that waits
	// with nothing from b asks for a check of b (frozen.go).
	done := b.await(cancelCtx, !plan.Watch)
	resp, err := b.Send(out, plan.Credentials)
	done()
	if err != nil && errors.Is(context.Cause(actx), ErrFrozen) && ctx.Err() == nil {
		err = fmt.Errorf("%w: %w", ErrFrozen, err)
	}
	if err != nil {
		if ctx.Err() == nil && !IsDialError(err) {
			b.ReportFailure(err) // a reset or a timeout: check it now (a refused dial is judged already)
		}
		cancel(err)
		return Attempt{}, &Error{Backend: b, Err: err}
	}
	return Attempt{Resp: resp, Backend: b, Lease: lease, Cancel: cancel}, nil
}

func (a *Attempter) outcome(attempt int, what string) {
	if attempt > 0 && a.opts.OnRetry != nil {
		a.opts.OnRetry(what)
	}
}

// Transport returns Do with plan as an http.RoundTripper, for one request's
// httputil.ReverseProxy (whose Transport sees only the request: the plan, with the request's
// Credentials, is bound here rather than carried in its context). Closing the response body
// ends the attempt.
func (a *Attempter) Transport(plan Plan) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) { return a.roundTrip(req, plan) })
}

func (a *Attempter) roundTrip(req *http.Request, plan Plan) (*http.Response, error) {
	at, err := a.Do(req.Context(), req, plan)
	if err != nil {
		return nil, err
	}
	if rwc, ok := at.Resp.Body.(io.ReadWriteCloser); ok { // a 101 Switching Protocols
		at.Resp.Body = &cancelRWC{ReadWriteCloser: rwc, cancel: at.Cancel}
	} else {
		at.Resp.Body = &cancelBody{ReadCloser: at.Resp.Body, cancel: at.Cancel}
	}
	return at.Resp, nil
}

type cancelBody struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (c *cancelBody) Close() error {
	err := c.ReadCloser.Close()
	c.cancel(nil)
	return err
}

type cancelRWC struct {
	io.ReadWriteCloser
	cancel context.CancelCauseFunc
}

func (c *cancelRWC) Close() error {
	err := c.ReadWriteCloser.Close()
	c.cancel(nil)
	return err
}

// retryable decides whether an attempt's outcome may be retried, and the least wait first.
func retryable(ctx context.Context, idempotent bool, body *countingBody, resp *http.Response, err error, _ bool) (time.Duration, bool) {
	if ctx.Err() != nil {
		return 0, false
	}
	unread := body == nil || body.read.Load() == 0
	if err != nil {
		if IsDialError(err) {
			return 0, unread
		}
		return 0, idempotent && unread
	}
	if !idempotent || !unread {
		return 0, false
	}
	switch resp.StatusCode {
	case http.StatusServiceUnavailable, http.StatusTooManyRequests:
		return retryAfter(resp), true
	case http.StatusBadGateway:
		// A proxy between watchsan and the apiserver (Envoy, a fault layer) could not reach it:
		// nothing of the request was served; another backend may be reachable (docs/design.md
		// section 1b). Found by the soak: a watch relayed such a 502 to its client.
		return 0, true
	case http.StatusGatewayTimeout:
		// "Too large resource version": the backend's cache is behind the raised RV; another
		// backend may have it now (its Retry-After, 1 s, is for the same backend). A gateway's
		// own timeout likewise.
		return 0, true
	}
	return 0, false
}

// countingBody is a request's body as the attempts read it. It tracks whether the transport
// read anything of it (read), and keeps the transport from closing it, so a request that never
// left can be sent again. What the attempts have read of it, up to MaxReplayBody, is kept, so
// that the transport can replay it through GetBody (docs/design.md section 10.7): a replay
// reads the kept bytes, then goes on with the client's body. Nothing is read ahead of the
// transport (full duplex: an apiserver may answer before the body is sent). Past
// MaxReplayBody the kept bytes are dropped and the body can no longer be replayed; only the
// reader at the head of it goes on.
type countingBody struct {
	read atomic.Int64 // bytes handed to the transport, over all attempts and replays

	mu    sync.Mutex // held across a read of r: one reader of the client's body at a time
	r     io.ReadCloser
	kept  []byte
	total int         // bytes read from r
	over  atomic.Bool // total passed MaxReplayBody: kept is dropped (read without mu by GetBody)
	err   error       // r's error once seen (io.EOF at its end)
}

// errNotReplayable: a replay of a body longer than MaxReplayBody.
var errNotReplayable = fmt.Errorf("watchsan keeps at most %d bytes of a request body to replay it", MaxReplayBody)

// newCountingBody wraps req's body; nil when it has none.
func newCountingBody(req *http.Request) *countingBody {
	if req.Body == nil || req.Body == http.NoBody {
		return nil
	}
	return &countingBody{r: req.Body}
}

// open returns a reader of the whole body for one attempt, and its GetBody.
func (c *countingBody) open() (io.ReadCloser, func() (io.ReadCloser, error)) {
	get := func() (io.ReadCloser, error) {
		// Not under mu, which an aborted attempt's read of the client's body may hold.
		if c.over.Load() {
			return nil, errNotReplayable
		}
		return &bodyReader{c: c}, nil
	}
	r, err := get()
	if err != nil { // a later attempt of a long body that was read: as unreplayable as before
		return &bodyReader{c: c, off: -1}, nil
	}
	return r, get
}

// bodyReader is one reading of a countingBody from its start; off < 0: it fails.
type bodyReader struct {
	c   *countingBody
	off int
}

func (b *bodyReader) Read(p []byte) (int, error) {
	c := b.c
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case b.off < 0 || (c.over.Load() && b.off != c.total):
		return 0, errNotReplayable
	case b.off < len(c.kept):
		n := copy(p, c.kept[b.off:])
		b.off += n
		c.read.Add(int64(n))
		return n, nil
	case c.err != nil:
		return 0, c.err
	}
	n, err := c.r.Read(p)
	if n > 0 {
		c.total += n
		b.off += n
		c.read.Add(int64(n))
		if !c.over.Load() && c.total > MaxReplayBody {
			c.over.Store(true)
			c.kept = nil
		} else if !c.over.Load() {
			c.kept = append(c.kept, p[:n]...)
		}
	}
	if err != nil {
		c.err = err
	}
	return n, err
}

func (b *bodyReader) Close() error { return nil }

// retryAfter reads a Retry-After in seconds (the form the apiserver sends), capped at a minute.
func retryAfter(resp *http.Response) time.Duration {
	n, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(min(n, 60)) * time.Second
}

// bufferBody reads up to 64 KiB of a body into memory and closes it.
func bufferBody(body io.ReadCloser) io.ReadCloser {
	data, _ := io.ReadAll(io.LimitReader(body, 64<<10))
	body.Close()
	return io.NopCloser(bytes.NewReader(data))
}

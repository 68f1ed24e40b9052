package upstream

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

// Retrier sends a request to the pool's backends and retries failures that happened before any
// response reached the client (issue #4 item 5). It is an http.RoundTripper; the request's URL
// holds only the client's path and query, and each attempt is re-targeted at a backend.
//
//   - Idempotent requests (GET, HEAD, OPTIONS; watches are GETs) are retried after a connection
//     failure, a 503 (the apiserver shutting down answers so) or a 429 (Retry-After honoured).
//   - Any other request is retried only when it provably never reached an upstream: the dial
//     failed and not one byte of its body was read.
//
// Attempts stop when Budget is spent; the last answer (response or error) is returned.
type Retrier struct {
	Pool *Pool
	// Budget bounds the time spent retrying one request; zero disables retries.
	Budget time.Duration
	// OnRetry, if set, is called with "retried", "recovered" (success after a retry) or
	// "exhausted" (budget spent; last failure returned).
	OnRetry func(outcome string)
	// Sleep waits between attempts; nil means a timer honouring ctx (tests may speed it up).
	Sleep func(ctx context.Context, d time.Duration) error
}

type backendKey struct{}

// BackendOf returns the backend that served resp's request (set by Retrier).
func BackendOf(req *http.Request) *Backend {
	b, _ := req.Context().Value(backendKey{}).(*Backend)
	return b
}

// countingBody tracks whether the transport read anything of a request body, and keeps the
// transport from closing it, so a request that never left can be sent again.
type countingBody struct {
	r    io.ReadCloser
	read atomic.Int64
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read.Add(int64(n))
	return n, err
}
func (c *countingBody) Close() error { return nil }

// RoundTrip implements http.RoundTripper.
func (rt *Retrier) RoundTrip(req *http.Request) (*http.Response, error) {
	var body *countingBody
	if req.Body != nil && req.Body != http.NoBody {
		body = &countingBody{r: req.Body}
		defer req.Body.Close()
	}
	idempotent := req.Method == http.MethodGet || req.Method == http.MethodHead || req.Method == http.MethodOptions
	deadline := time.Now().Add(rt.Budget)
	var last *Backend
	for attempt := 0; ; attempt++ {
		b := rt.Pool.PickExcept(last)
		last = b
		out := req.Clone(context.WithValue(req.Context(), backendKey{}, b))
		out.URL = b.Target(req.URL)
		out.Host = ""
		if body != nil {
			out.Body = body
			out.GetBody = nil
		}
		resp, err := b.RoundTrip(out)
		if err != nil {
			err = &Error{Backend: b, Err: err}
		}

		wait, retry := rt.retryable(req, idempotent, body, resp, err)
		if !retry {
			if attempt > 0 && rt.OnRetry != nil {
				rt.OnRetry("recovered")
			}
			return resp, err
		}
		if wait <= 0 {
			wait = backoff(attempt)
		}
		if rt.Budget <= 0 || time.Now().Add(wait).After(deadline) || req.Context().Err() != nil {
			if attempt > 0 && rt.OnRetry != nil {
				rt.OnRetry("exhausted")
			}
			return resp, err
		}
		if resp != nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		}
		if rt.OnRetry != nil {
			rt.OnRetry("retried")
		}
		sleep := rt.Sleep
		if sleep == nil {
			sleep = sleepCtx
		}
		if serr := sleep(req.Context(), wait); serr != nil {
			return nil, err
		}
	}
}

// retryable decides whether an attempt's outcome may be retried, and how long to wait first
// (0: the default backoff).
func (rt *Retrier) retryable(req *http.Request, idempotent bool, body *countingBody, resp *http.Response, err error) (time.Duration, bool) {
	if req.Context().Err() != nil {
		return 0, false
	}
	unread := body == nil || body.read.Load() == 0
	if err != nil {
		if isDialError(err) {
			return 0, unread
		}
		return 0, idempotent && unread && isConnectionError(err)
	}
	if !idempotent || !unread {
		return 0, false
	}
	switch resp.StatusCode {
	case http.StatusServiceUnavailable, http.StatusTooManyRequests:
		return retryAfter(resp), true
	}
	return 0, false
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

func isDialError(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

func isConnectionError(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.EPIPE)
}

func retryAfter(resp *http.Response) time.Duration {
	s := resp.Header.Get("Retry-After")
	if s == "" {
		return 0
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}

// backoff is exponential from 100ms, capped at 2s, with +-25% jitter.
func backoff(attempt int) time.Duration {
	d := 100 * time.Millisecond << min(attempt, 5)
	if d > 2*time.Second {
		d = 2 * time.Second
	}
	return d*3/4 + time.Duration(rand.Int64N(int64(d/2)+1))
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync/atomic"
	"syscall"
	"time"
)

// Backend is one apiserver.
type Backend struct {
	// URL is the apiserver's base URL (scheme, host, optional path prefix).
	URL *url.URL
	t   *transports

	healthy atomic.Bool
	// checkNow wakes the health loop early (passive failure signal).
	checkNow chan struct{}
}

// String names the backend in logs and metrics (scheme://host[/prefix], no credentials).
func (b *Backend) String() string { return b.URL.String() }

// Healthy reports the last health verdict.
func (b *Backend) Healthy() bool { return b.healthy.Load() }

// RoundTrip sends req (whose URL must already point at this backend) with the client's own
// Authorization when it has one, and with watchsan's lent identity otherwise (when lending is
// configured; else without credentials). A dial failure marks the backend for an immediate
// health check.
func (b *Backend) RoundTrip(req *http.Request) (*http.Response, error) {
	rt := b.t.forward
	if b.t.lend != nil && req.Header.Get("Authorization") == "" {
		rt = b.t.lend
	}
	resp, err := rt.RoundTrip(req)
	if err != nil && errors.Is(err, syscall.ECONNREFUSED) {
		b.healthy.Store(false)
		select {
		case b.checkNow <- struct{}{}:
		default:
		}
	}
	return resp, err
}

// Target rewrites u (a request URL of the client's) to this backend, keeping path and query.
func (b *Backend) Target(u *url.URL) *url.URL {
	out := *b.URL
	out.Path = b.URL.Path + u.Path
	if u.RawPath != "" {
		out.RawPath = b.URL.EscapedPath() + u.RawPath
	} else {
		out.RawPath = ""
	}
	out.RawQuery = u.RawQuery
	return &out
}

// Probe asks the backend's /readyz whether it serves, within timeout. Any answer but a 5xx means
// the server is there (401/403: it answers, we just may not read readyz).
func (b *Backend) Probe(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.Target(&url.URL{Path: "/readyz"}).String(), nil)
	if err != nil {
		return err
	}
	resp, err := b.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode >= 500 {
		return fmt.Errorf("%s/readyz answered %d", b, resp.StatusCode)
	}
	return nil
}

package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
)

// Nothing waits on a frozen backend (docs/design.md section 10.8). A short
// request whose attempt is still waiting for its response headers when its backend is
// declared unhealthy (no PING answered: frozen, or gone) is cut at once: retried on another
// backend when repeating it is safe, else answered 503 with Retry-After (ErrFrozen).

// ErrFrozen is the failure of an attempt cut because its backend was declared unhealthy while
// it waited for the response: the request may have been processed (apistatus answers 503,
// saying so).
var ErrFrozen = errors.New("the upstream stopped answering while the request was in flight (declared unhealthy)")

// waiters are a backend's attempts waiting for response headers.
type waiters struct {
	mu  sync.Mutex
	set map[*waiter]struct{}
}

type waiter struct{ cancel context.CancelCauseFunc }

// wait registers an attempt's cancel until done is called.
func (w *waiters) wait(cancel context.CancelCauseFunc) (done func()) {
	x := &waiter{cancel: cancel}
	w.mu.Lock()
	if w.set == nil {
		w.set = map[*waiter]struct{}{}
	}
	w.set[x] = struct{}{}
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		delete(w.set, x)
		w.mu.Unlock()
	}
}

// cutAll cuts every waiting attempt with ErrFrozen; it returns how many.
func (w *waiters) cutAll() int {
	w.mu.Lock()
	cut := make([]*waiter, 0, len(w.set))
	for x := range w.set {
		cut = append(cut, x)
	}
	clear(w.set)
	w.mu.Unlock()
	for _, x := range cut {
		x.cancel(ErrFrozen)
	}
	return len(cut)
}

// await registers an attempt on b until done is called: while it waits for its response
// headers, a short request's attempt (cut true) is cut at once if b is found unhealthy
// meanwhile; and any attempt that has waited a quarter of the ping timeout while nothing at
// all came from b asks for a check of b now (Pool.recheck: at most one per health interval),
// rather than at the check's next tick: a request waiting on a frozen backend starts its
// detection (docs/design.md section 10.9).
func (b *Backend) await(cancel context.CancelCauseFunc, cut bool) (done func()) {
	clk := b.pool.clk
	sent := clk.Now().UnixNano()
	early := clk.AfterFunc(b.pool.opts.PingTimeout/4, func() {
		if b.hc.aliveAt.Load() < sent {
			go b.pool.recheck(b) // not in the clock's callback: a fake clock runs it under its lock
		}
	})
	if !cut {
		return func() { early.Stop() }
	}
	unregister := b.waiting.wait(cancel)
	return func() {
		early.Stop()
		unregister()
	}
}

// safeToRepeat says whether a request that may have been processed can be sent again: a read
// (GET, HEAD, OPTIONS), or a write the apiserver makes safe to repeat, an update or patch whose
// body carries a resourceVersion precondition (a repeat of one that was processed meets 409
// Conflict, which clients handle). body is the whole body (nil: unknown or too long).
func safeToRepeat(method string, h http.Header, body []byte) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return true
	case http.MethodPut, http.MethodPatch:
	default:
		return false
	}
	if body == nil || !strings.Contains(h.Get("Content-Type"), "json") {
		return false // protobuf, CBOR, YAML: not read here
	}
	body = bytes.TrimSpace(body)
	if len(body) > 0 && body[0] == '[' { // JSON patch: a test of /metadata/resourceVersion
		var ops []struct {
			Op    string `json:"op"`
			Path  string `json:"path"`
			Value any    `json:"value"`
		}
		if json.Unmarshal(body, &ops) != nil {
			return false
		}
		for _, op := range ops {
			if op.Op == "test" && op.Path == "/metadata/resourceVersion" && op.Value != nil && op.Value != "" {
				return true
			}
		}
		return false
	}
	var obj struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	return json.Unmarshal(body, &obj) == nil && obj.Metadata.ResourceVersion != ""
}

// whole returns the body as read so far when it was read to its end and kept; nil otherwise,
// and nil at once while a read of the client's body is in flight (an aborted attempt's may
// wait for the client indefinitely).
func (c *countingBody) whole() []byte {
	if c == nil {
		return []byte{}
	}
	if !c.mu.TryLock() {
		return nil
	}
	defer c.mu.Unlock()
	if c.over.Load() || !errors.Is(c.err, io.EOF) {
		return nil
	}
	return c.kept
}

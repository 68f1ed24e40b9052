package watch

import (
	"context"
	"net/http"
)

// The connections watches take from net/http (package chunked): a private watch's on
// HTTP/1.1 (subscriber.start) and a detached shared watch's (detach.go). Both are in
// Handler.conns until released, so that shutdown waits for them (WaitDetached), and both tell
// the server's writer wrapper when their response outlives the handler (Detacher).

// Detacher is implemented by a ResponseWriter wrapper (found through Unwrap) that needs to know
// when a watch's response outlives its handler: Detach is called once, on the handler's
// goroutine, after the connection was hijacked and before the handler returns, and nothing is
// written through the wrapper after it. The function it returns, if not nil, is called once
// when the detached stream has ended and its connection is closed, with the body bytes written
// (the events, without the chunk framing, as a Write through the wrapper would have counted
// them). It may be called before the handler returns.
type Detacher interface {
	Detach() (end func(written int64))
}

// detachOf is the Detach of the Detacher among w and the writers it wraps (for
// chunked.Options); nil: none.
func detachOf(w http.ResponseWriter) func() func(int64) {
	for w != nil {
		if d, ok := w.(Detacher); ok {
			return d.Detach
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return nil
		}
		w = u.Unwrap()
	}
	return nil
}

// The classes of the connections watches take, in Handler.conns.
const (
	classOwned    = iota // a private watch's (subscriber.start)
	classDetached        // a detached shared watch's
)

// WaitDetached waits until no watch that owns its connection is open (a detached shared
// watch, or a private one on HTTP/1.1, subscriber.start), or until ctx ends: then it ends
// those left (a detached one's stream ends where it is, shutdown; a private one's connection
// is closed) and returns ctx's error. At shutdown every feed ends (Deps.Done) and its watches
// with it, each after its queue and the last chunk; http.Server.Shutdown does not wait for
// hijacked connections, so the server calls this after it. Watches that take their connection
// after it gave up are ended at once.
func (h *Handler) WaitDetached(ctx context.Context) error { return h.conns.Wait(ctx) }

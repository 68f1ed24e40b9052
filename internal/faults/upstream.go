package faults

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
)

var (
	errUpstreamAborted = errors.New("faults: upstream handler aborted the response")
	errWatchDone       = errors.New("faults: the layer is done with this watch")
)

// upstream is the answer next gives to the layer's copy of a watch request, read through a
// pipe as next writes it: next runs in a goroutine of its own, writing into the pipe, and the
// layer reads events from the other end. Nothing is buffered beyond one write.
type upstream struct {
	cancel context.CancelFunc
	pr     *io.PipeReader
	pw     *io.PipeWriter

	h         http.Header // what next writes into
	readyOnce sync.Once
	ready     chan struct{} // closed once status and header are set
	status    int           // 0: next finished without answering
	header    http.Header   // snapshot of h at WriteHeader

	aborted atomic.Bool // next panicked (a broken upstream response, usually)
	done    chan struct{}
}

// startUpstream sends a copy of r to next, asking for identity encoding so the layer can
// read the stream. r itself is not modified.
func startUpstream(next http.Handler, r *http.Request, log *zap.Logger) *upstream {
	ctx, cancel := context.WithCancel(r.Context())
	out := r.Clone(ctx)
	out.Header.Set("Accept-Encoding", "identity")
	pr, pw := io.Pipe()
	u := &upstream{
		cancel: cancel,
		pr:     pr,
		pw:     pw,
		h:      make(http.Header),
		ready:  make(chan struct{}),
		done:   make(chan struct{}),
	}
	go func() {
		defer close(u.done)
		defer func() {
			if p := recover(); p != nil {
				u.aborted.Store(true)
				if p != http.ErrAbortHandler {
					log.Error("upstream handler panicked", zap.Any("panic", p))
				}
				u.pw.CloseWithError(errUpstreamAborted)
			} else {
				u.pw.Close()
			}
			u.readyOnce.Do(func() { close(u.ready) })
		}()
		next.ServeHTTP(u, out)
	}()
	return u
}

// close cancels the upstream request and waits for next to return. Safe to call more than
// once.
func (u *upstream) close() {
	u.cancel()
	u.pr.CloseWithError(errWatchDone)
	<-u.done
}

// Header, WriteHeader, Write and Flush make upstream the http.ResponseWriter next writes to.

func (u *upstream) Header() http.Header { return u.h }

func (u *upstream) WriteHeader(code int) {
	if code >= 100 && code < 200 { // informational: not the answer
		return
	}
	u.readyOnce.Do(func() {
		u.status = code
		u.header = u.h.Clone()
		close(u.ready)
	})
}

func (u *upstream) Write(p []byte) (int, error) {
	u.WriteHeader(http.StatusOK)
	return u.pw.Write(p)
}

// Flush does nothing: every Write already waits until the layer has read it.
func (u *upstream) Flush() {}

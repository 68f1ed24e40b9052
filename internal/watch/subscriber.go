package watch

import (
	"net/http"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/budget"
	"github.com/watchsan/watchsan/internal/chunked"
	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/upstream"
)

// subscriber is one client response fed by a feed: what the client asked for (its format, its
// bookmarks; its deadline is the feed's for now, see feed), the RV policy on what it is sent
// (policy.go: the initial phase, the resume point, the delete memory scoped by the identity
// the upstream sees, and the counts of what it decided), its framing and its batched writes
// bounded by the write timeout. It is the feed's sink.
type subscriber struct {
	policy
	client *http.Request
	// allowBookmarks: the client asked for bookmarks (watchsan asks the upstream always).
	allowBookmarks bool

	w      http.ResponseWriter
	rc     *http.ResponseController
	format stream.Format
	out    chunked.Batch // what writer writes, batched until the feed would wait
	writer *stream.Writer
}

// newSubscriber answers the client's request r on w, its batch buffers charged to mem (the
// feed's account; nil: nothing charged).
func newSubscriber(h *Handler, w http.ResponseWriter, r *http.Request, p params, resource string, log *watchLog, mem *budget.Account) *subscriber {
	rc := http.NewResponseController(w)
	return &subscriber{policy: newPolicy(h, r.URL.Path, resource, log), client: r, allowBookmarks: p.allowBookmarks,
		w: w, rc: rc, out: chunked.NewBatch(w, rc, h.cfg.WriteTimeout, mem)}
}

// A private watch on HTTP/1.1 owns its connection (docs/design.md section 5, "One write per
// flush"). net/http frames a chunked body through its connection's 4 KiB buffer: a flush of a
// batch bigger than that is three write(2)s (the buffer with the chunk's size line and the
// first bytes, then the rest, then the CRLF, each one a wakeup of the client), which measured
// about a fifth of watchsan's CPU per event at saturation. So once the response head is out
// (with Connection: close, as a detached shared watch's), the watch takes the connection
// (package chunked) and writes each batch as one chunk in one write; its handler goroutine
// stays the feed's, as before (Handler.Serve). What is counted at the response's end is
// counted as before: the body bytes go to the Detacher (the server's access log and request
// metrics) when the connection is closed; WaitDetached waits for these too.

// mayOwn says whether the watch of r will take its connection once its head is out: HTTP/1.1
// through net/http, not while watchsan shuts down (the watch ends at once then).
func (h *Handler) mayOwn(r *http.Request) bool {
	return r.ProtoMajor == 1 && r.ProtoMinor >= 1 && !h.noOwn && !h.stopping()
}

// start begins the stream in format, the first answer's header copied from hdr, its policy
// fs; the status line and headers go out at once. On HTTP/1.1 the watch then takes its
// connection, and leave is called when the client leaves.
func (s *subscriber) start(format stream.Format, hdr http.Header, fs *fix.Stream, leave func()) {
	s.begin(fs)
	s.format = format
	upstream.CopyEndToEnd(s.w.Header(), hdr)
	s.w.Header().Del("Content-Length")
	own := s.h.mayOwn(s.client)
	if own {
		s.w.Header().Set("Connection", "close") // the watch closes it after its last chunk
	}
	s.w.WriteHeader(http.StatusOK)
	// An error is sticky: the feed's first read ends the watch with it.
	if s.out.FlushClient() == nil && own {
		c, err := chunked.Take(s.rc, chunked.Options{WriteTimeout: s.h.cfg.WriteTimeout, Detach: detachOf(s.w),
			Left: leave, Set: &s.h.conns, Class: classOwned})
		if err == nil {
			s.out.Own(c)
			if c.Start() != nil {
				// Shutdown gave up waiting (the connection is closed), or the client sent
				// more, a request the head said this connection will not answer: the stream
				// ends at once.
				leave()
			}
			// Nothing of net/http's response is used again: let it and its connection's
			// buffers go once the handler returns (Handler.Serve detaches).
			s.w, s.rc = nil, nil
		}
	}
	s.writer = stream.NewWriter(format, &s.out)
}

// write writes an event decide let through, batched (sink).
func (s *subscriber) write(ev *stream.Event, d fix.Decision) error {
	// Bookmarks go only to clients that asked for them (watchsan asks upstream always, to see
	// progress on quiet watches); they still advance the resume point (fix.LastDelivered).
	if ev.Type == stream.Bookmark && !s.allowBookmarks {
		return nil
	}
	if d.Action == fix.Rewrite {
		return s.writer.WriteWithRV(ev, d.RV)
	}
	// Not flushed here: the feed flushes before it waits for its upstream (attemptBody).
	return s.writer.Write(ev)
}

// flush sends what is batched (sink).
func (s *subscriber) flush() error { return s.out.Flush() }

// broken says how the client's stream ends after a write to it failed, or endNone (sink).
func (s *subscriber) broken() (EndReason, error) {
	err := s.out.Err()
	switch {
	case err == nil:
		return endNone, nil
	case s.out.Slow():
		return EndSlowClient, err
	}
	return s.h.leftEnd(s.client), err
}

// gone says whether the client went away (sink).
func (s *subscriber) gone() bool {
	if c := s.out.Conn(); c != nil {
		// net/http no longer watches an owned connection, and cancels the request's context
		// once a detached handler returned (Handler.Serve): only the connection's reader says.
		return c.Gone()
	}
	return s.client.Context().Err() != nil
}

// relist writes st, an ERROR 410, and flushes it (sink).
func (s *subscriber) relist(st *metav1.Status) {
	if err := s.writer.WriteStatus(st); err == nil {
		_ = s.out.Flush()
	}
}

// slowClient counts and logs a watch cut because its client did not take a write within the
// write timeout; what (SlowClientReasons) says what it was sent.
func (s *subscriber) slowClient(what string) { s.h.slowClient(s.log, s.path, what) }

// slowClient counts and logs a watch of path cut because its client did not take a write
// within the write timeout; what (SlowClientReasons) says what it was sent.
func (h *Handler) slowClient(log *watchLog, path, what string) {
	h.deps.Metrics.SlowClients.WithLabelValues(what).Inc()
	log.Info("a write to the client did not complete within the write timeout; its watch is cut and its upstream watch closed",
		zap.String("path", path), zap.String("what", what), zap.Duration("writeTimeout", h.cfg.WriteTimeout))
}

package watch

import (
	"net"
	"net/http"
	"sync/atomic"
)

// A private watch on HTTP/1.1 owns its connection (docs/design.md section 5, "One write per
// flush"). net/http frames a chunked body through its connection's 4 KiB buffer: a flush of a
// batch bigger than that is three write(2)s (the buffer with the chunk's size line and the
// first bytes, then the rest, then the CRLF, each one a wakeup of the client), which measured
// about a fifth of watchsan's CPU per event at saturation. So once the response head is out
// (with Connection: close, as a detached shared watch's), the watch takes the connection
// (Hijack) and writes each batch as one chunk in one write; its handler goroutine stays the
// feed's, as before. net/http no longer tells the request's context when the client leaves,
// so one small goroutine per connection waits in a 1-byte Read for that and cancels the
// feed; at the end the watch writes the last chunk and closes the connection.
//
// What is counted at the response's end is counted as before: the body bytes go to the
// Detacher (the server's access log and request metrics) when the connection is closed. The
// connection is the one the listener accepted, so it stays counted against --max-connections
// and the per-source limit until it is closed. http.Server.Shutdown does not wait for
// hijacked connections: WaitDetached waits for these too.

// ownedConn is a client connection a private watch took from net/http.
type ownedConn struct {
	c net.Conn
	// left is closed when the client left (its connection's end, or any byte it sent: a
	// request watchsan will not answer on this connection); gone says the same, for a check.
	left chan struct{}
	gone atomic.Bool
	// leave is called once the client left (the feed's cancel); read is closed when the
	// reader goroutine returned.
	leave func()
	read  chan struct{}
	end   func(int64) // the Detacher's; nil: none
	bytes int64       // body bytes written (the frames), for end; the writer's
	h     *Handler
}

// mayOwn says whether the watch of r will take its connection once its head is out: HTTP/1.1
// through net/http, not while watchsan shuts down (the watch ends at once then).
func (h *Handler) mayOwn(r *http.Request) bool {
	return r.ProtoMajor == 1 && r.ProtoMinor >= 1 && !h.noOwn && !h.stopping()
}

// own takes the client's connection, w's, whose head was written and flushed with
// Connection: close; leave is called once the client leaves. It says whether it took it; then
// w is not used again. Not taken (w cannot be hijacked): the batch goes on through w. Taken
// but shutdown gave up on owned connections, or the client sent more: the stream ends at once.
func (b *batchWriter) own(h *Handler, w http.ResponseWriter, leave func()) bool {
	conn, brw, err := b.rc.Hijack() // clears the connection's deadlines
	if err != nil {
		return false
	}
	b.w, b.rc = nil, nil
	oc := &ownedConn{c: conn, left: make(chan struct{}), leave: leave, read: make(chan struct{}), h: h}
	if dt := detacherOf(w); dt != nil {
		oc.end = dt.Detach()
	}
	b.conn = oc
	if !h.addOwned(oc) {
		_ = conn.Close() // the first write fails: the watch ends
	}
	if brw.Reader.Buffered() > 0 {
		// Bytes the client sent after its request (pipelined; a watch's client waits for its
		// answer): a request watchsan will not answer on this connection, which the head said
		// it closes. The stream ends at once.
		oc.leftNow()
		close(oc.read)
		return true
	}
	go oc.wait() // exits when the connection is closed (finish)
	return true
}

// wait waits for the client to leave: its connection's end, or any byte it sends.
func (oc *ownedConn) wait() {
	defer close(oc.read)
	var b [1]byte
	_, _ = oc.c.Read(b[:])
	oc.leftNow()
}

func (oc *ownedConn) leftNow() {
	if oc.gone.CompareAndSwap(false, true) {
		close(oc.left)
		oc.leave()
	}
}

// finish ends the body of an owned connection: the last chunk (unless a write failed: the
// stream is broken then), the connection closed, its reader waited for, the bytes counted.
// Nothing is written after it. Without an owned connection it does nothing: net/http ends the
// body when the handler returns.
func (b *batchWriter) finish() {
	oc := b.conn
	if oc == nil {
		return
	}
	_ = b.flush()
	if b.err == nil {
		b.arm()
		if _, err := oc.c.Write(lastChunk); err != nil {
			b.fail(err)
		}
		b.disarm()
	}
	_ = oc.c.Close() // ends wait
	<-oc.read
	// Counted before WaitDetached is told: once it returns, every owned watch's access log
	// line and request metrics are out.
	if oc.end != nil {
		oc.end(oc.bytes)
	}
	oc.h.removeOwned(oc)
}

// leftChan is closed when the client leaves: an owned connection's reader says so, else the
// request's context (net/http's own reader).
func (b *batchWriter) leftChan(r *http.Request) <-chan struct{} {
	if b.conn != nil {
		return b.conn.left
	}
	return r.Context().Done()
}

// addOwned puts oc in the set WaitDetached waits for; false once the waiting gave up (the
// caller ends oc at once).
func (h *Handler) addOwned(oc *ownedConn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.detachForced {
		return false
	}
	h.owned[oc] = struct{}{}
	return true
}

// removeOwned takes oc out of that set, and tells WaitDetached when nothing is left in it.
func (h *Handler) removeOwned(oc *ownedConn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.owned, oc)
	h.wakeDetachedLocked()
}

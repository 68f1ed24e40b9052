package watch

import (
	"errors"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/watchsan/watchsan/internal/chunked"
)

// Detached shared watches (docs/design.md section 11, docs/bench/NOTES.md
// "Where the 27.7 KiB go"). A shared feed's subscriber on HTTP/1.1 holds no upstream stream,
// yet while its handler holds the request, net/http keeps the connection's 4 KiB reader and
// writer, the response's 2 KiB chunking buffer and the parked handler's goroutine stack: two
// thirds of what an idle shared watch cost. So once the response head is out the member takes
// the connection (Hijack) and the handler returns, all of that with it. From then on the member
// writes the chunked body itself, from a goroutine that runs only while it has frames queued;
// one small goroutine per connection is parked in a 1-byte Read, since net/http no longer tells
// the request's context when the client leaves. HTTP/2 streams cannot be hijacked (and their
// buffers are the connection's, not the watch's): they keep the handler, as do private feeds.
//
// What would have ended with the handler ends with the member: watchsan_open_watches, the
// stream's end metrics and log line, and whatever wraps the ResponseWriter and implements
// Detacher (the server's access log line, request metrics and in-flight gauge). The connection
// is the one the listener accepted, so it stays counted against --max-connections and the
// per-source limit until the member closes it. Shutdown ends detached members like every
// member (their feeds end); http.Server.Shutdown does not wait for hijacked connections, so the
// server waits for them with WaitDetached.

// detached is a member that owns its client's connection (docs/design.md section 11): the
// connection (package chunked) and the writer that runs while the member has frames queued.
// Everything is detach's but the state below conn, which its member's mu guards.
type detached struct {
	sf   *sharedFeed
	m    *member
	conn *chunked.Conn
	// remote and requestID are the request's, for the log lines about the stream.
	remote, requestID string
	open              prometheus.Gauge // watchsan_open_watches of its resource
	timer             clock.Timer      // timeoutSeconds or the max lifetime (lifetime.go); nil: none
	// atDeadline is how the stream ends when timer fires (params.deadlineEnd), or
	// EndRebalance once rebalanced; written under the member's mu.
	atDeadline EndReason
	// unrebalance stops Deps.Rebalance's hold on the stream; nil: none. Under the member's mu.
	unrebalance func()

	writing  bool      // a writer goroutine runs (write)
	deadline bool      // timer fired, or Deps.Rebalance's end was called: the stream ends with atDeadline
	closing  EndReason // the writer is writing the last chunk, ending with it
	ended    bool      // the stream ended: closed and counted
}

// detach answers the client from m, whose response head serve has written, on its own: it
// flushes the head, takes the connection and returns true; the handler then returns. False:
// the connection could not be taken (not net/http's HTTP/1, or a shutdown under way) and
// the caller serves the member on the handler, as on HTTP/2.
func (sf *sharedFeed) detach(w http.ResponseWriter, r *http.Request, m *member, p params, requestID string) bool {
	h := sf.h
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Now().Add(h.cfg.WriteTimeout)) // the head, as every write (chunked.Batch)
	if rc.Flush() != nil {
		_ = rc.SetWriteDeadline(time.Time{})
		return false // the head did not get out: the handler's pump ends it (client-gone)
	}
	d := &detached{sf: sf, m: m, remote: r.RemoteAddr, requestID: requestID,
		open: h.deps.Metrics.OpenWatches.WithLabelValues(sf.pol.resource), atDeadline: p.deadlineEnd()}
	conn, err := chunked.Take(rc, chunked.Options{WriteTimeout: h.cfg.WriteTimeout, Detach: detachOf(w),
		Left:  func() { d.close(EndClientGone) },
		Abort: func() { d.close(EndShutdown) },
		Set:   &h.conns, Class: classDetached})
	if err != nil {
		_ = rc.SetWriteDeadline(time.Time{})
		return false
	}
	d.conn = conn
	d.open.Inc()
	if p.timeout > 0 {
		m.mu.Lock()
		d.timer = h.clk.AfterFunc(p.timeout, d.timedOut)
		m.mu.Unlock()
	}
	switch err := conn.Start(); {
	case errors.Is(err, chunked.ErrRefused): // shutdown gave up waiting
		d.close(EndShutdown)
		return true
	case err != nil: // the client sent more: the head said the connection closes
		d.close(EndClientGone)
		return true
	}
	m.mu.Lock()
	m.det = d
	if m.q.Len() > 0 || m.over || m.done { // the ring's backlog at its join, or an end already
		d.kickLocked()
	}
	m.mu.Unlock()
	if h.deps.Rebalance != nil {
		stop := h.deps.Rebalance(r, d.rebalanced)
		m.mu.Lock()
		if d.ended {
			m.mu.Unlock()
			stop()
			return true
		}
		d.unrebalance = stop
		m.mu.Unlock()
	}
	return true
}

// rebalanced: the server sheds the client's connection (Deps.Rebalance); the writer ends the
// stream with the last chunk, as at its deadline, and closes the connection.
func (d *detached) rebalanced() {
	d.m.mu.Lock()
	if !d.deadline {
		d.deadline, d.atDeadline = true, EndRebalance
		d.kickLocked()
	}
	d.m.mu.Unlock()
}

// timedOut: the stream's deadline (its timeoutSeconds, or the max lifetime) passed; the writer
// ends the stream with the last chunk.
func (d *detached) timedOut() {
	d.m.mu.Lock()
	d.deadline = true
	d.kickLocked()
	d.m.mu.Unlock()
}

// kickLocked starts the writer unless it runs or the stream ended; the member's mu is held.
func (d *detached) kickLocked() {
	if !d.writing && !d.ended {
		d.writing = true
		go d.write() // exits when the queue is empty, or the stream ends
	}
}

// write writes what the member has queued, a chunk at a time (take: what it holds stays
// counted against its bound until written), until nothing is, then exits; or ends the stream
// when its queue filled, its feed ended or its client's timeoutSeconds passed, after what was
// queued (the deadline: at once), with the last chunk (a clean end, as the handler's return
// would have been).
func (d *detached) write() {
	m := d.m
	limit := d.conn.ChunkLimit()
	for {
		m.mu.Lock()
		if d.ended {
			d.writing = false
			m.mu.Unlock()
			return
		}
		deadline, atDeadline := d.deadline, d.atDeadline
		var q [][]byte
		if !deadline {
			q = m.takeLocked(limit)
		}
		over, done, end := m.over, m.done, m.end
		if len(q) == 0 && !over && !done && !deadline {
			d.writing = false
			m.mu.Unlock()
			return
		}
		m.mu.Unlock()
		err := d.conn.WriteFrames(q)
		if len(q) > 0 {
			m.written()
		}
		if err != nil {
			d.failed(err)
			return
		}
		switch {
		case len(q) > 0:
			continue // more may be queued: the end comes after it
		case deadline:
			d.finish(atDeadline)
		case over:
			d.sf.log.Info("a shared feed's subscriber fell its buffer's worth behind; its stream is ended, its client re-watches from its last resourceVersion",
				zap.String("remote", d.remote), zap.Int("bufferBytes", m.max))
			d.finish(EndSlowClient)
		case done:
			if end == endNone {
				end = EndNoResume
			}
			d.finish(end)
		}
		return
	}
}

// failed ends the stream whose write failed: at the write timeout a slow client (its stream
// cut there, as on the handler), else the client is gone.
func (d *detached) failed(err error) {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		d.sf.slowClient(slowEvents)
		d.close(EndSlowClient)
		return
	}
	d.close(EndClientGone)
}

// finish ends the stream cleanly with end: the last chunk, then the connection closed.
func (d *detached) finish(end EndReason) {
	d.m.mu.Lock()
	d.closing = end
	d.m.mu.Unlock()
	if err := d.conn.Finish(); err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		d.sf.slowClient(slowEvents)
		end = EndSlowClient
	}
	d.close(end)
}

// close ends the stream with end (the writer's, if it is writing the last chunk): the
// connection closed, the member off its feed, and everything counted that the handler's return
// would have counted. Only the first call does anything.
func (d *detached) close(end EndReason) {
	m, sf := d.m, d.sf
	m.mu.Lock()
	if d.ended {
		m.mu.Unlock()
		return
	}
	d.ended = true
	if d.closing != endNone {
		end = d.closing
	}
	if d.timer != nil {
		d.timer.Stop()
	}
	unrebalance := d.unrebalance
	d.unrebalance = nil
	m.mu.Unlock()
	if unrebalance != nil {
		unrebalance()
	}
	d.conn.Close() // ends the reader; a write under way fails
	sf.leave(m)
	d.open.Dec()
	met := sf.h.deps.Metrics
	met.StreamEnds.WithLabelValues(end.String()).Inc()
	if end == EndSlowClient {
		met.SharedSlowSubscribers.Inc()
	}
	if ce := sf.log.Check(zap.DebugLevel, "shared watch ended"); ce != nil {
		ce.Write(zap.String("remote", d.remote), zap.String("requestID", d.requestID), zap.Stringer("reason", end), zap.Bool("detached", true))
	}
	// Counted before WaitDetached is told: once it returns, every detached watch's access log
	// line and request metrics are out.
	d.conn.Release()
}

// DetachedWatches is how many detached watches are open (tests, /debug).
func (h *Handler) DetachedWatches() int { return h.conns.Len(classDetached) }

package watch

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/utils/clock"
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

// detacherOf finds the Detacher among w and the writers it wraps; nil: none.
func detacherOf(w http.ResponseWriter) Detacher {
	for w != nil {
		if d, ok := w.(Detacher); ok {
			return d
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return nil
		}
		w = u.Unwrap()
	}
	return nil
}

// lastChunk ends a chunked body (no trailers).
var lastChunk = []byte("0\r\n\r\n")

// detached is a member that owns its client's connection (docs/design.md section 11). Its
// state below conn is guarded by its member's mu.
type detached struct {
	sf   *sharedFeed
	m    *member
	conn net.Conn
	// remote and requestID are the request's, for the log lines about the stream.
	remote, requestID string
	open              prometheus.Gauge // watchsan_open_watches of its resource
	timer             clock.Timer      // timeoutSeconds or the max lifetime (lifetime.go); nil: none
	atDeadline        EndReason        // how the stream ends when timer fires (params.deadlineEnd)
	end               func(int64)      // the Detacher's; nil: none
	bytes             atomic.Int64     // body bytes written (the frames)
	// tls: the connection is TLS's, whose writes cannot be retried after a deadline passed
	// (tls.Conn.SetWriteDeadline), so put does not probe it, and its chunks are a record's.
	tls bool
	// gaveBack counts the chunks whose buffer put gave back, their write blocked (tests).
	gaveBack atomic.Int32

	writing  bool      // a writer goroutine runs (write)
	deadline bool      // timer fired: the stream ends with atDeadline
	closing  EndReason // the writer is writing the last chunk, ending with it
	ended    bool      // the stream ended: closed and counted
}

// detach answers the client from m, whose response head serve has written, on its own: it
// flushes the head, hijacks the connection and returns true; the handler then returns. False:
// the connection could not be hijacked (not net/http's HTTP/1, or a shutdown under way) and
// the caller serves the member on the handler, as on HTTP/2.
func (sf *sharedFeed) detach(w http.ResponseWriter, r *http.Request, m *member, p params, requestID string) bool {
	h := sf.h
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Now().Add(h.cfg.WriteTimeout)) // the head, as every write (batchWriter)
	if rc.Flush() != nil {
		_ = rc.SetWriteDeadline(time.Time{})
		return false // the head did not get out: the handler's pump ends it (client-gone)
	}
	conn, brw, err := rc.Hijack() // clears the connection's deadlines
	if err != nil {
		_ = rc.SetWriteDeadline(time.Time{})
		return false
	}
	// Bytes the client sent after its request (pipelined; a watch's client waits for its
	// answer) are a request watchsan will not answer on this connection, which the head said it
	// closes: the stream ends at once.
	pipelined := brw.Reader.Buffered() > 0
	_, isTLS := conn.(*tls.Conn)
	d := &detached{sf: sf, m: m, conn: conn, remote: r.RemoteAddr, requestID: requestID, tls: isTLS,
		open: h.deps.Metrics.OpenWatches.WithLabelValues(sf.pol.resource), atDeadline: p.deadlineEnd()}
	if dt := detacherOf(w); dt != nil {
		d.end = dt.Detach()
	}
	d.open.Inc()
	if p.timeout > 0 {
		m.mu.Lock()
		d.timer = h.clk.AfterFunc(p.timeout, d.timedOut)
		m.mu.Unlock()
	}
	switch {
	case !h.addDetached(d):
		d.close(EndShutdown)
		return true
	case pipelined:
		d.close(EndClientGone)
		return true
	}
	m.mu.Lock()
	m.det = d
	if m.q.len() > 0 || m.over || m.done { // the ring's backlog at its join, or an end already
		d.kickLocked()
	}
	m.mu.Unlock()
	go d.read() // exits when the connection is closed (d.close)
	return true
}

// read waits for the client to leave: its connection's end, or any byte it sends.
func (d *detached) read() {
	var b [1]byte
	_, _ = d.conn.Read(b[:])
	d.close(EndClientGone)
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
	limit := chunkMax
	if d.tls {
		limit = tlsChunkMax
	}
	for {
		m.mu.Lock()
		if d.ended {
			d.writing = false
			m.mu.Unlock()
			return
		}
		deadline := d.deadline
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
		err := d.chunk(q)
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
			d.finish(d.atDeadline)
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

// chunk writes the frames q, at most a chunk's worth (take's limit) or one frame bigger than
// that, as one chunk within the write timeout.
func (d *detached) chunk(q [][]byte) error {
	n := 0
	for _, f := range q {
		n += len(f)
	}
	if n == 0 { // a chunk of 0 bytes would end the body
		return nil
	}
	until := d.arm()
	h := strconv.AppendUint(make([]byte, 0, chunkHead), uint64(n), 16)
	h = append(h, '\r', '\n')
	var err error
	if len(q) == 1 && n >= chunkMax || d.tls && n > tlsChunkMax {
		// Too big for a chunk's buffer: sent as it is, nothing copied.
		err = d.send(h, q[0], crlf)
	} else {
		pool := &batchPool
		if d.tls {
			pool = &tlsChunkPool
		}
		bp := pool.Get().(*[]byte)
		b := append((*bp)[:0], h...)
		for _, f := range q {
			b = append(b, f...)
		}
		*bp = append(b, crlf...)
		err = d.put(*bp, h, q, until, func() {
			*bp = (*bp)[:0] // the pools' buffers are empty (batchWriter appends to them)
			pool.Put(bp)
		})
	}
	if err == nil {
		d.bytes.Add(int64(n))
	}
	return err
}

// put writes b, a chunk copied from its size line h, the frames q and a CRLF, by until, and
// releases b. A connection that takes it within probeWait takes it in one write (section 5,
// "One write per flush"). One that does not is full: its client is not reading, or not as fast
// as the feed goes. Then b is released at once and what is left is written straight from h
// and q, which the member holds and counts until they are written: a writer blocked on its
// client holds no buffer of its own (docs/design.md section 11, "Bounds"; the audit's 1,000
// non-reading subscribers held 64 KiB each in it). A TLS connection cannot go on after a
// write's deadline, so it is not probed; its chunks are one record each (tlsChunkMax).
func (d *detached) put(b, h []byte, q [][]byte, until time.Time, release func()) error {
	wait := time.Now().Add(probeWait)
	probe := !d.tls && (until.IsZero() || wait.Before(until))
	if probe {
		_ = d.conn.SetWriteDeadline(wait)
	}
	n, err := d.conn.Write(b)
	release()
	if !probe || err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	d.gaveBack.Add(1)
	_ = d.conn.SetWriteDeadline(until)
	for i := -1; i <= len(q); i++ {
		part := crlf
		switch {
		case i < 0:
			part = h
		case i < len(q):
			part = q[i]
		}
		if n >= len(part) {
			n -= len(part)
			continue
		}
		if _, err := d.conn.Write(part[n:]); err != nil {
			return err
		}
		n = 0
	}
	return nil
}

// probeWait is how long put lets a chunk's one write wait on a full connection before it
// gives its buffer back: far above what a write into a connection with room takes.
const probeWait = 20 * time.Millisecond

var crlf = []byte("\r\n")

// chunkMax is the most a chunk of frames holds: with its size line and its CRLF, a batch.
const chunkMax = batchSize - 16

// tlsChunkMax is the most a chunk of frames holds on a TLS connection, whose writes go out
// as records of at most 16 KiB each (RFC 8446 section 5.1), one system call each: chunks of
// one record's size take as many system calls as bigger ones would, and hold a smaller buffer
// while they wait on a client (put).
const tlsChunkMax = 16<<10 - 16

// tlsChunkPool holds the buffers of TLS connections' chunks (tlsChunkMax, its size line and
// CRLF).
var tlsChunkPool = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// arm bounds writing out one chunk by the write timeout (Config.WriteTimeout), as the
// handler's batchWriter bounds a flush: a client that stopped reading is cut, never waited on
// for good. On the real clock, as the connection's deadline is. It returns the deadline (zero:
// none).
func (d *detached) arm() time.Time {
	wt := d.sf.h.cfg.WriteTimeout
	if wt <= 0 {
		return time.Time{}
	}
	until := time.Now().Add(wt)
	_ = d.conn.SetWriteDeadline(until)
	return until
}

func (d *detached) send(bs ...[]byte) error {
	for _, b := range bs {
		if _, err := d.conn.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// failed ends the stream whose write failed: at the write timeout a slow client (its stream
// cut there, as on the handler), else the client is gone.
func (d *detached) failed(err error) {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		d.sf.pol.slowClient(slowEvents)
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
	d.arm()
	if _, err := d.conn.Write(lastChunk); err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		d.sf.pol.slowClient(slowEvents)
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
	m.mu.Unlock()
	_ = d.conn.Close() // ends read; a write under way fails
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
	if d.end != nil {
		d.end(d.bytes.Load())
	}
	sf.h.removeDetached(d)
}

// addDetached puts d in the set WaitDetached waits for; false once the waiting gave up (the
// caller ends d at once).
func (h *Handler) addDetached(d *detached) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.detachForced {
		return false
	}
	h.detached[d] = struct{}{}
	return true
}

// removeDetached takes d out of that set, and tells WaitDetached when it is empty.
func (h *Handler) removeDetached(d *detached) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.detached, d)
	h.wakeDetachedLocked()
}

// wakeDetachedLocked tells WaitDetached when no watch owns its connection any more; mu is held.
func (h *Handler) wakeDetachedLocked() {
	if len(h.detached) == 0 && len(h.owned) == 0 && h.detachedGone != nil {
		close(h.detachedGone)
		h.detachedGone = nil
	}
}

// WaitDetached waits until no watch that owns its connection is open (a detached shared
// watch, or a private one on HTTP/1.1, own.go), or until ctx ends: then it closes the
// connections of those left (their streams end where they are, shutdown) and returns ctx's
// error. At shutdown every feed ends (Deps.Done) and its watches with it, each after its
// queue and the last chunk; http.Server.Shutdown does not wait for hijacked connections, so
// the server calls this after it. Watches that take their connection after it gave up are
// ended at once.
func (h *Handler) WaitDetached(ctx context.Context) error {
	for {
		h.mu.Lock()
		if len(h.detached) == 0 && len(h.owned) == 0 {
			h.mu.Unlock()
			return nil
		}
		if h.detachedGone == nil {
			h.detachedGone = make(chan struct{})
		}
		gone := h.detachedGone
		h.mu.Unlock()
		select {
		case <-gone:
		case <-ctx.Done():
			h.mu.Lock()
			h.detachForced = true
			left := make([]*detached, 0, len(h.detached))
			for d := range h.detached {
				left = append(left, d)
			}
			owned := make([]net.Conn, 0, len(h.owned))
			for oc := range h.owned {
				owned = append(owned, oc.c)
			}
			h.mu.Unlock()
			for _, d := range left {
				d.close(EndShutdown)
			}
			for _, c := range owned {
				_ = c.Close() // the watch's next write fails, and it ends
			}
			return ctx.Err()
		}
	}
}

// DetachedWatches is how many detached watches are open (tests, /debug).
func (h *Handler) DetachedWatches() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.detached)
}

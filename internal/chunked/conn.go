package chunked

import (
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// A watch whose response head is out, with Connection: close, may take its HTTP/1.1 client's
// connection from net/http (Take) and write the rest of the chunked body itself:
//
//   - a private watch, so that each batch is one chunk in one write(2) instead of net/http's
//     three (docs/design.md section 5, "One write per flush"), its handler returning so that
//     net/http lets go of the connection's buffers;
//   - a detached shared watch, whose handler returns and whose member writes its queued frames
//     from a goroutine that runs only while there are some (docs/design.md section 11).
//
// Either way net/http no longer tells the request's context when the client leaves, so one
// small goroutine per connection waits in a 1-byte Read for that (Options.Left); at the end the
// watch writes the last chunk (Finish), closes the connection (Close) and tells what the
// response's end would have told (Release: the Detacher's count of body bytes, the Set that
// shutdown waits on). The connection is the one the listener accepted, so it stays counted
// against --max-connections and the per-source limit until it is closed.

// Conn is a client's HTTP/1.1 connection taken from net/http, its body written as chunks. Its
// writes (WriteFrames, WriteChunk, WriteRaw, Finish) come from one goroutine at a time, the
// watch's writer; Close and the reader may run beside them.
type Conn struct {
	c net.Conn // Take
	// tls: the connection is TLS's, whose writes cannot be retried after a deadline passed
	// (tls.Conn.SetWriteDeadline), so WriteFrames does not probe it, and its chunks are a
	// record's (ChunkLimit). Take.
	tls bool
	// timeout bounds writing one chunk in WriteFrames and the last chunk (Finish); 0: none.
	// Take, from Options.WriteTimeout.
	timeout time.Duration
	// pipelined: the client sent bytes after its request. Take's; Start reads it.
	pipelined bool
	// left is closed, and gone set, once the client left (markLeft: the reader, or Start).
	left chan struct{}
	gone atomic.Bool
	// read is closed when no reader goroutine reads any more (markLeft's caller).
	read chan struct{}
	// onLeft, abort: Options.Left and Options.Abort. end: what Options.Detach returned; nil:
	// nothing told. set, class: Options.Set and Options.Class. All Take's.
	onLeft, abort func()
	end           func(written int64)
	set           *Set
	class         int
	// bytes counts the body bytes written (the frames, not the chunk framing); the writer's.
	bytes atomic.Int64
	// gaveBack counts the chunks whose buffer WriteFrames gave back, their write blocked
	// (tests).
	gaveBack atomic.Int32
}

// Options is what Take needs to know of the watch that takes its connection.
type Options struct {
	// WriteTimeout bounds writing out one chunk (WriteFrames, Finish) on the real clock; 0:
	// none.
	WriteTimeout time.Duration
	// Detach, if not nil, is called once by Take once the connection is taken; the function it
	// returns, if not nil, is called once by Release with the body bytes written. Nil: no one
	// is told.
	Detach func() (end func(written int64))
	// Left is called once, from the reader goroutine, when the client left: its connection's
	// end, or any byte it sent (a request watchsan will not answer on a connection it said it
	// closes). Nil: nothing is called; Left and Gone still say so.
	Left func()
	// Abort is called by Set.Wait when it gives up with the connection still in the Set. Nil:
	// Wait closes the connection, and the watch's next write fails.
	Abort func()
	// Set, if not nil, holds the connection from Start until Release, counted under Class (Len).
	// A Set whose Wait gave up refuses it: Start says so.
	Set   *Set
	Class int
}

// ErrRefused: the Set had given up waiting (shutdown) when the connection was taken; Start
// closed it. ErrPipelined: the client sent bytes after its request, a request watchsan will
// not answer on this connection. The stream ends at once in both cases.
var (
	ErrRefused   = errors.New("chunked: the connection was taken after shutdown gave up waiting")
	ErrPipelined = errors.New("chunked: the client sent more after its request")
)

// Take takes the connection of rc's response, whose head was written and flushed, from
// net/http (Hijack, which clears the connection's deadlines). An error: it could not (not
// net/http's HTTP/1, or a shutdown under way), and the response goes on through net/http.
// Otherwise nothing is written through rc again, and the caller calls Start, then in the end
// Close and Release. Options' callbacks are not called before Start.
func Take(rc *http.ResponseController, o Options) (*Conn, error) {
	conn, brw, err := rc.Hijack()
	if err != nil {
		return nil, err
	}
	_, isTLS := conn.(*tls.Conn)
	c := &Conn{c: conn, tls: isTLS, timeout: o.WriteTimeout, left: make(chan struct{}), read: make(chan struct{}),
		onLeft: o.Left, abort: o.Abort, set: o.Set, class: o.Class}
	if o.Detach != nil {
		c.end = o.Detach()
	}
	// Bytes the client sent after its request (pipelined; a watch's client waits for its
	// answer) are a request watchsan will not answer on this connection.
	c.pipelined = brw.Reader.Buffered() > 0
	return c, nil
}

// Start puts the connection in its Set (Options.Set) and starts the reader that waits for the
// client to leave (Options.Left). ErrRefused (the connection is closed then) or ErrPipelined:
// the stream ends at once; Left and Gone say the client left, and Options.Left is not called:
// the caller ends the stream as it should. Called once, before any write, after the caller
// has all that Options' callbacks use.
func (c *Conn) Start() error {
	switch {
	case c.set != nil && !c.set.add(c):
		_ = c.c.Close() // a write fails from now on
		c.markLeft()
		close(c.read)
		return ErrRefused
	case c.pipelined:
		c.markLeft()
		close(c.read)
		return ErrPipelined
	}
	go c.wait() // exits when the connection is closed (Close), or the client sends or leaves
	return nil
}

// wait waits for the client to leave: its connection's end, or any byte it sends.
func (c *Conn) wait() {
	var b [1]byte
	_, _ = c.c.Read(b[:])
	c.markLeft()
	close(c.read) // before Left, which may Release (and so wait for this)
	if c.onLeft != nil {
		c.onLeft()
	}
}

func (c *Conn) markLeft() {
	if c.gone.CompareAndSwap(false, true) {
		close(c.left)
	}
}

// Left is closed once the client left.
func (c *Conn) Left() <-chan struct{} { return c.left }

// Gone says whether the client left.
func (c *Conn) Gone() bool { return c.gone.Load() }

// ChunkLimit is the most a chunk of frames written by WriteFrames holds (but for one frame
// bigger than that): a batch, or on TLS a record (tlsChunkMax).
func (c *Conn) ChunkLimit() int {
	if c.tls {
		return tlsChunkMax
	}
	return chunkMax
}

// GaveBack is how many chunks WriteFrames wrote from their frames after giving their buffer
// back (tests).
func (c *Conn) GaveBack() int32 { return c.gaveBack.Load() }

// SetWriteDeadline sets the connection's (a Batch's flush deadline).
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.c.SetWriteDeadline(t) }

// WriteFrames writes the frames q, at most ChunkLimit bytes or one frame bigger than that, as
// one chunk within the write timeout. The caller holds the frames and counts them until it
// returns (see put).
func (c *Conn) WriteFrames(q [][]byte) error {
	n := 0
	for _, f := range q {
		n += len(f)
	}
	if n == 0 { // a chunk of 0 bytes would end the body
		return nil
	}
	until := c.arm()
	if len(q) == 1 && n >= chunkMax || c.tls && n > tlsChunkMax {
		// Too big for a chunk's buffer: sent as it is, nothing copied.
		return c.WriteRaw(q[0])
	}
	pool := &batchPool
	if c.tls {
		pool = &tlsChunkPool
	}
	var head [chunkHead]byte
	h := sizeLine(head[:0], n)
	bp := pool.Get().(*[]byte)
	b := append((*bp)[:0], make([]byte, chunkHead)...) // the size line's room
	for _, f := range q {
		b = append(b, f...)
	}
	*bp = b
	err := c.put(frame(b, h), h, q, until, func() {
		*bp = (*bp)[:0] // the pools' buffers are empty (Batch appends to them)
		pool.Put(bp)
	})
	if err == nil {
		c.bytes.Add(int64(n))
	}
	return err
}

// put writes b, a chunk made of its size line h, the frames q and a CRLF, by until, and
// releases b. A connection that takes it within probeWait takes it in one write (section 5,
// "One write per flush"). One that does not is full: its client is not reading, or not as fast
// as the feed goes. Then b is released at once and what is left is written straight from h
// and q, which the caller holds and counts until they are written: a writer blocked on its
// client holds no buffer of its own (docs/design.md section 11, "Bounds"; the audit's 1,000
// non-reading subscribers held 64 KiB each in it). A TLS connection cannot go on after a
// write's deadline, so it is not probed; its chunks are one record each (tlsChunkMax).
func (c *Conn) put(b, h []byte, q [][]byte, until time.Time, release func()) error {
	wait := time.Now().Add(probeWait)
	probe := !c.tls && (until.IsZero() || wait.Before(until))
	if probe {
		_ = c.c.SetWriteDeadline(wait)
	}
	n, err := c.c.Write(b)
	release()
	if !probe || err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	c.gaveBack.Add(1)
	_ = c.c.SetWriteDeadline(until)
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
		if _, err := c.c.Write(part[n:]); err != nil {
			return err
		}
		n = 0
	}
	return nil
}

// WriteChunk writes b as one chunk in one write: b[:HeadRoom] is room for the chunk's size
// line, the frames follow, and b has room for the CRLF after them (Batch's buffers). The
// caller bounds it with its deadline.
func (c *Conn) WriteChunk(b []byte) error {
	if len(b) <= chunkHead {
		return nil // a chunk of 0 bytes would end the body
	}
	var head [chunkHead]byte
	n := len(b) - chunkHead
	if _, err := c.c.Write(frame(b, sizeLine(head[:0], n))); err != nil {
		return err
	}
	c.bytes.Add(int64(n))
	return nil
}

// sizeLine appends a chunk's size line for n bytes to dst: at most 8 hex digits and CRLF.
func sizeLine(dst []byte, n int) []byte {
	return append(strconv.AppendUint(dst, uint64(n), 16), '\r', '\n')
}

// frame makes a chunk of the frames b[chunkHead:]: their size line h right before them, in the
// room kept for it, and the CRLF after them (in b's capacity, which its buffers keep for it).
func frame(b, h []byte) []byte {
	start := chunkHead - len(h)
	copy(b[start:], h)
	return append(b, crlf...)[start:]
}

// WriteRaw writes p as a chunk of its own, nothing copied: its size line, p, a CRLF. The
// caller bounds it with its deadline (WriteFrames: the write timeout).
func (c *Conn) WriteRaw(p []byte) error {
	if len(p) == 0 {
		return nil // a chunk of 0 bytes would end the body
	}
	var head [chunkHead]byte
	h := sizeLine(head[:0], len(p))
	for _, part := range [][]byte{h, p, crlf} {
		if _, err := c.c.Write(part); err != nil {
			return err
		}
	}
	c.bytes.Add(int64(len(p)))
	return nil
}

// Finish writes the last chunk, within the write timeout: the body's clean end. An error
// wrapping os.ErrDeadlineExceeded: the client did not take it in time.
func (c *Conn) Finish() error {
	c.arm()
	_, err := c.c.Write(lastChunk)
	return err
}

// Close closes the connection: the reader returns, a write under way fails. It may be called
// more than once, from any goroutine.
func (c *Conn) Close() { _ = c.c.Close() }

// Release, once the connection is closed (Close), waits for the reader, tells Options.Detach's
// end the body bytes written and takes the connection out of its Set, in that order: once
// Set.Wait returns, every released connection's end was told. Called once, by the watch.
func (c *Conn) Release() {
	<-c.read
	if c.end != nil {
		c.end(c.bytes.Load())
	}
	if c.set != nil {
		c.set.remove(c)
	}
}

// arm bounds writing out one chunk by the write timeout: a client that stopped reading is cut,
// never waited on for good. On the real clock, as the connection's deadline is. It returns the
// deadline (zero: none).
func (c *Conn) arm() time.Time {
	if c.timeout <= 0 {
		return time.Time{}
	}
	until := time.Now().Add(c.timeout)
	_ = c.c.SetWriteDeadline(until)
	return until
}

// probeWait is how long put lets a chunk's one write wait on a full connection before it
// gives its buffer back: far above what a write into a connection with room takes.
const probeWait = 20 * time.Millisecond

// lastChunk ends a chunked body (no trailers).
var lastChunk = []byte("0\r\n\r\n")

var crlf = []byte("\r\n")

// chunkMax is the most a chunk of frames holds: with its size line and its CRLF, a batch.
const chunkMax = BatchSize - 16

// tlsChunkMax is the most a chunk of frames holds on a TLS connection, whose writes go out
// as records of at most 16 KiB each (RFC 8446 section 5.1), one system call each: chunks of
// one record's size take as many system calls as bigger ones would, and hold a smaller buffer
// while they wait on a client (put).
const tlsChunkMax = 16<<10 - 16

// tlsChunkPool holds the buffers of TLS connections' chunks (tlsChunkMax, its size line and
// CRLF).
var tlsChunkPool = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

package chunked

import (
	"errors"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/watchsan/watchsan/internal/budget"
)

// BatchSize is the most a batch of events holds before it is written: what the Reader reads
// at most at once (stream's busy buffer), so a busy watch writes once per upstream read.
const BatchSize = 64 << 10

// chunkRoom is what a batch buffer holds beyond BatchSize: a chunk's size line (at most 8 hex
// digits and CRLF, before the frames) and the CRLF after them, when the watch writes its
// chunked body itself (Conn), plus slack.
const chunkRoom = 16

// chunkHead is the room a batch keeps before its frames for the chunk's size line when it is
// written to a taken connection: 8 hex digits and CRLF.
const chunkHead = 10

// batchPool holds batch buffers between bursts: a quiet watch holds none. Its buffers are
// empty, with room for a batch and its chunk framing.
var batchPool = sync.Pool{New: func() any { b := make([]byte, 0, BatchSize+chunkRoom); return &b }}

// Batch collects whole events for the client's response and writes them in one go when
// flushed (or when the next event would not fit). The first error is sticky: the client's
// connection is broken then, and nothing more is written to it. One goroutine uses it.
//
// It writes to net/http's ResponseWriter, or, once the watch took its HTTP/1.1 client's
// connection (Own), to the Conn, each batch one chunk of the chunked body in one write(2)
// (docs/design.md section 5, "One write per flush").
//
// What one flush sends the client (the events of one upstream read, at most a batch and any
// frames too big for one) gets timeout (Config.WriteTimeout) to get through: a client that
// stops reading fills its connection's buffers, and then the write blocks. Without a deadline
// it would block for good, the watch holding its upstream stream open (100 watches
// that never read held 431 MiB, and passed for stalled upstreams). With one, the write fails,
// the watch ends (EndSlowClient) and its upstream watch is closed. The deadline is set at the
// first write after a flush and cleared when the flush is done: it bounds writing, never the
// time between writes (a quiet watch writes nothing for minutes), and over HTTP/2 a deadline
// is the stream's, which resets the stream when it passes whether or not a write is pending.
type Batch struct {
	// w and rc are the response's (NewBatch), nil once the connection is taken (Own).
	w  http.ResponseWriter
	rc *http.ResponseController
	// conn is the client's connection once the watch took it (Own); nil: w frames the body.
	conn *Conn
	buf  *[]byte // from batchPool while it holds something; nil otherwise
	// unflushed: bytes were handed to w since its last flush.
	unflushed bool
	err       error

	// timeout bounds writing out what one flush sends; 0: none (the writer cannot set
	// deadlines). NewBatch's; arm clears it for a writer that cannot.
	timeout time.Duration
	// deadline is the current flush's (on the real clock, as the connection's deadline is),
	// zero between flushes; slow: a write failed at it (the client did not read).
	deadline time.Time
	slow     bool

	// mem is charged BatchSize while the writer holds a batch buffer (package budget); a
	// writer it refuses writes each frame as it comes, unbatched. Nil: nothing charged.
	// NewBatch's.
	mem *budget.Account
}

// NewBatch writes to w (rc its controller), what each flush sends bounded by timeout, its
// batch buffers charged to mem (nil: nothing charged).
func NewBatch(w http.ResponseWriter, rc *http.ResponseController, timeout time.Duration, mem *budget.Account) Batch {
	return Batch{w: w, rc: rc, timeout: timeout, mem: mem}
}

// Own writes the rest of the body to c, the response's connection taken (Take) after a
// flush; nothing is written to the ResponseWriter again.
func (b *Batch) Own(c *Conn) {
	b.w, b.rc, b.conn = nil, nil, c
}

// Conn is the connection the batch writes to (Own); nil: the ResponseWriter.
func (b *Batch) Conn() *Conn { return b.conn }

// Err is the first error of a write to the client; nil: none.
func (b *Batch) Err() error { return b.err }

// Slow says the first error was the write deadline's: the client did not take a flush's
// worth within the timeout.
func (b *Batch) Slow() bool { return b.slow }

// arm starts the deadline of the flush that the write about to start is part of, unless it
// runs already. Per flush, not per watch: a client that reads, however slowly, only has to
// take each flush's worth within the timeout.
func (b *Batch) arm() {
	if b.timeout <= 0 || !b.deadline.IsZero() {
		return
	}
	b.deadline = time.Now().Add(b.timeout)
	if err := b.setWriteDeadline(b.deadline); err != nil {
		b.timeout = 0 // a ResponseWriter that cannot (a test's recorder): no deadline, as before
		b.deadline = time.Time{}
	}
}

// disarm clears the deadline once a flush is through (see Batch).
func (b *Batch) disarm() {
	if b.deadline.IsZero() {
		return
	}
	b.deadline = time.Time{}
	if b.err == nil {
		_ = b.setWriteDeadline(time.Time{})
	}
}

func (b *Batch) setWriteDeadline(t time.Time) error {
	if b.conn != nil {
		return b.conn.SetWriteDeadline(t)
	}
	return b.rc.SetWriteDeadline(t)
}

// fail records the first error of a write to the client and whether it was the deadline's:
// an HTTP/1 connection says so (os.ErrDeadlineExceeded), an HTTP/2 stream is reset when its
// deadline passes and only says it is closed, hence the clock.
func (b *Batch) fail(err error) {
	b.err = err
	if !b.deadline.IsZero() && (errors.Is(err, os.ErrDeadlineExceeded) || !time.Now().Before(b.deadline)) {
		b.slow = true
	}
}

func (b *Batch) Write(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.buf != nil && len(*b.buf)+len(p) > BatchSize {
		b.writeOut()
		if b.err != nil {
			return 0, b.err
		}
	}
	if len(p) >= BatchSize || b.buf == nil && !b.mem.Take(budget.Writers, BatchSize) {
		// Nothing to gain from copying a frame this big; it goes out as it is. Nor does a
		// frame when the memory budget has no room for a batch: unbatched is slower, not
		// wrong.
		b.unflushed = true
		b.arm()
		if err := b.writeRaw(p); err != nil {
			b.fail(err)
			return 0, err
		}
		return len(p), nil
	}
	if b.buf == nil {
		b.buf = batchPool.Get().(*[]byte)
		if b.conn != nil {
			*b.buf = (*b.buf)[:chunkHead] // the size line's room
		}
	}
	*b.buf = append(*b.buf, p...)
	return len(p), nil
}

// writeRaw writes a frame too big for a batch: through w, or as a chunk of its own.
func (b *Batch) writeRaw(p []byte) error {
	if b.conn == nil {
		_, err := b.w.Write(p)
		return err
	}
	return b.conn.WriteRaw(p)
}

// writeOut hands the batch to the response writer, without flushing it, or writes it to the
// taken connection as one chunk, and returns the buffer to the pool.
func (b *Batch) writeOut() {
	if b.buf == nil {
		return
	}
	bb := *b.buf
	if b.err == nil && (b.conn != nil && len(bb) > chunkHead || b.conn == nil && len(bb) > 0) {
		b.unflushed = true
		b.arm()
		var err error
		if b.conn != nil {
			err = b.conn.WriteChunk(bb)
		} else {
			_, err = b.w.Write(bb)
		}
		if err != nil {
			b.fail(err)
		}
	}
	*b.buf = bb[:0]
	batchPool.Put(b.buf)
	b.buf = nil
	b.mem.Give(budget.Writers, BatchSize)
}

// Flush writes the batch out and flushes the response to the client.
func (b *Batch) Flush() error {
	if b.buf == nil && !b.unflushed {
		return b.err
	}
	b.writeOut()
	return b.FlushClient()
}

// FlushClient flushes what the response writer holds to the client (the status line and
// headers too, before the first event). A taken connection holds nothing: its writes went
// out as they were made.
func (b *Batch) FlushClient() error {
	b.unflushed = false
	if b.err == nil && b.conn == nil {
		b.arm()
		if err := b.rc.Flush(); err != nil {
			b.fail(err)
		}
	}
	b.disarm()
	return b.err
}

// Finish ends the body on a taken connection: what is batched, the last chunk (unless a
// write failed: the stream is broken then), the connection closed and released (Release).
// Nothing is written after it. Without a taken connection it does nothing: net/http ends the
// body when the handler returns.
func (b *Batch) Finish() {
	c := b.conn
	if c == nil {
		return
	}
	_ = b.Flush()
	if b.err == nil {
		if err := c.Finish(); err != nil {
			b.fail(err)
		}
	}
	c.Close() // ends the reader
	c.Release()
}

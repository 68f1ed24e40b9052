package stream

import (
	"errors"
	"fmt"
	"io"
	"sync"
)

// DefaultMaxFrameSize is the frame size limit a Reader applies when given none: 16 MiB, the
// limit client-go's decoders apply to a watch frame.
const DefaultMaxFrameSize = 16 << 20

const (
	// idleBufSize is the buffer a Reader reads into at a frame boundary once its source has
	// caught up (the last Read returned less than it was offered): there a Read is likely to
	// wait for the next event, maybe for minutes, and a quiet watch should hold little while
	// it waits (a 16 KiB buffer per idle watch was 38% of the heap with 5,000 of them).
	// (A value ending exactly at the end of a first Read of this size has its newline on the
	// line path, which waits for it, and not on the byte loop, which never does: the newline
	// is whitespace between frames, and FuzzReaderJSON compares the paths without it;
	// testdata/fuzz/FuzzReaderJSON/053dda50f8c59ae5 is such a value at 512.)
	idleBufSize = 512
	// busyBufSize is the buffer of a Reader that has more to read than idleBufSize: taken
	// from busyPool, so bursts on many watches share a few. Each Read is followed by a flush
	// to the client (internal/watch), so its size sets the syscalls per byte of a busy
	// stream: 64 KiB measured 5-15% less CPU per event than the pass-through's 32 KiB copy
	// buffer. It grows beyond for bigger frames.
	busyBufSize = 64 << 10
	// minRead is the least free space a Reader offers to one Read before it compacts or grows.
	minRead = 4 << 10
	// frameSlack is what a buffer holds beyond the frame limit: the protobuf length prefix and
	// the newline after a JSON value.
	frameSlack = 16
	// maxEmptyReads is how many (0, nil) reads in a row are taken before io.ErrNoProgress.
	maxEmptyReads = 100
	// shrinkAfter is how many small frames in a row let a Reader drop a buffer grown
	// beyond busyBufSize.
	shrinkAfter = 64
	// maxDepth bounds nesting in JSON and CBOR, as apimachinery's decoders do.
	maxDepth = 10000
)

// A Reader reads watch events one frame at a time from a watch response body, in one format.
// It buffers at most one frame (plus what a single Read returned beyond it), parses only the
// event envelope and the object's identifying metadata, and never panics on any input.
//
// A Reader is not safe for concurrent use.
type Reader struct {
	format Format
	src    io.Reader
	max    int

	// buf[start:end] is read but not yet consumed.
	buf        []byte
	start, end int
	// rerr is the error the last Read returned, reported once the buffered bytes are used up.
	rerr error
	// err is sticky: once Next fails, it fails the same way forever.
	err error
	// small counts the frames in a row that would have fit busyBufSize; after a run of them
	// a buffer grown for one big frame is let go.
	small int
	// idle is the idleBufSize buffer, kept for the Reader's life; pooled is buf's pool entry
	// while buf is a busyPool buffer. short: the last Read returned less than it was offered.
	idle   []byte
	pooled *[]byte
	short  bool

	split splitter
	ev    Event
	// ps is the parse state (the splitters' scanners, the parser's arena and keys), taken
	// from psPool when a frame begins and given back when the Reader is about to wait for the
	// next one in its idle buffer (fill): an idle watch does not hold its 744 bytes (the
	// Reader was 1,200 bytes, in a 1,280-byte size class). Nil between.
	ps *parseState
	// bytesOnly is given to every parse state taken (tests: the scanners' byte loop alone);
	// jsStats sums the JSON scanner's counts of those given back (tests).
	bytesOnly bool
	jsStats   jsonScanStats

	// budget is charged for buf while it is not the idle buffer (SetBudget); charged is what
	// it holds of it now. Nil: nothing is charged.
	budget  Budget
	charged int
}

// A Budget is charged for the memory a Reader holds beyond its small idle buffer: the buffer
// of a frame being read, up to the frame limit. Take reserves n bytes and reports whether it
// may; Give returns bytes taken. A Reader refused ends with ErrOverBudget. Both are called
// only from Next, on the Reader's goroutine, and the Reader gives back everything it took once
// Next has failed.
type Budget interface {
	Take(n int) bool
	Give(n int)
}

// Close lets the Reader's buffers go and gives back what its Budget holds for them; Next
// fails with ErrClosed afterwards. The Event returned last is not to be used after it. Not
// safe to call while Next runs.
func (r *Reader) Close() {
	if r.err == nil {
		_ = r.fail(ErrClosed)
	}
}

// SetBudget makes the Reader charge b for its buffers (Budget); call it before the first Next.
func (r *Reader) SetBudget(b Budget) { r.budget = b }

// psPool holds the parse states of Readers that wait for their next frame.
var psPool = sync.Pool{New: func() any { return new(parseState) }}

// state returns the Reader's parse state, taking one (the splitter bound to it and reset)
// when it holds none.
func (r *Reader) state() *parseState {
	if r.ps == nil {
		ps := psPool.Get().(*parseState)
		ps.js.bytesOnly, ps.jsSkip.bytesOnly = r.bytesOnly, r.bytesOnly
		r.ps = ps
		r.split.bind(ps)
		r.split.reset()
	}
	return r.ps
}

// putState gives the parse state back; only where no frame is begun (the splitter is reset
// when one is taken again).
func (r *Reader) putState() {
	ps := r.ps
	if ps == nil {
		return
	}
	r.ps = nil
	r.split.bind(nil)
	st := &r.jsStats
	st.blocks += ps.js.stats.blocks
	st.byteBlocks += ps.js.stats.byteBlocks
	st.tailBytes += ps.js.stats.tailBytes
	ps.js.stats = jsonScanStats{}
	psPool.Put(ps)
}

// splitter finds the end of one frame in a growing buffer. It is resumable: split is called
// with the bytes buffered from the frame's first byte, again and again as more arrive (always
// the same prefix), and carries its progress between calls until reset.
type splitter interface {
	// split returns the frame's length once b holds all of it; 0 while it needs more bytes;
	// ErrFrameTooLarge as soon as the frame is known to exceed max; an ErrMalformed error
	// when b cannot begin a frame. next says when the bytes after b come: a splitter may wait
	// for more (return 0) only where that cannot change the frame it finds, only delay it.
	split(b []byte, max int, next arrival) (int, error)
	reset()
	// bind points the splitter at the Reader's parse state (nil: given back).
	bind(ps *parseState)
}

// arrival says when the bytes after those buffered can come.
type arrival int

const (
	// arriveNow: the last Read filled all it was offered, so more is likely there already.
	arriveNow arrival = iota
	// arriveLater: the last Read returned less than it was offered: the next may wait long
	// (a quiet watch), so what is buffered should be delivered now if it is whole.
	arriveLater
	// arriveNever: the stream ended or failed; nothing more comes.
	arriveNever
)

// NewReader returns a Reader of f-formatted watch events from r. maxFrame bounds one frame's
// size in bytes (the protobuf length prefix and a JSON value's newline not counted); <=0 means
// DefaultMaxFrameSize.
func NewReader(f Format, r io.Reader, maxFrame int) *Reader {
	if maxFrame <= 0 {
		maxFrame = DefaultMaxFrameSize
	}
	rd := &Reader{format: f, src: r, max: maxFrame}
	switch f {
	case JSON:
		rd.split = &jsonSplitter{}
	case Protobuf:
		rd.split = pbSplitter{}
	case CBOR:
		rd.split = &cborSplitter{}
	default:
		rd.err = fmt.Errorf("stream: unknown format %d", int(f))
	}
	return rd
}

// Format returns the format the Reader reads.
func (r *Reader) Format() Format { return r.format }

// Next reads the next event. It returns io.EOF when the stream ends cleanly between frames,
// io.ErrUnexpectedEOF when it ends inside one, ErrFrameTooLarge, an error wrapping ErrMalformed
// when a frame cannot be parsed, or the underlying Read error wrapped. Every error is final:
// later calls return it again.
//
// The returned Event, and its Raw, are reused by the next call to Next; Clone what must
// outlive it.
func (r *Reader) Next() (*Event, error) {
	if r.err != nil {
		return nil, r.err
	}
	if r.ps != nil {
		r.split.reset() // else when a parse state is taken
	}
	for {
		b := r.buf[r.start:r.end]
		if r.format == JSON {
			// Whitespace between JSON values belongs to no frame.
			k := 0
			for k < len(b) && isJSONSpace(b[k]) {
				k++
			}
			r.start += k
			b = b[k:]
		}
		if len(b) > 0 {
			next := arriveNow
			switch {
			case r.rerr != nil:
				next = arriveNever
			case r.short:
				next = arriveLater
			}
			r.state()
			n, err := r.split.split(b, r.max, next)
			if err != nil {
				return nil, r.fail(err)
			}
			if n > 0 {
				raw := b[:n:n]
				r.start += n
				if n <= busyBufSize/2 {
					r.small++
				} else {
					r.small = 0
				}
				if err := r.parse(raw); err != nil {
					return nil, r.fail(err)
				}
				return &r.ev, nil
			}
		}
		if r.rerr != nil {
			r.release()
			switch {
			case r.rerr == io.EOF && len(b) == 0:
				return nil, r.fail(io.EOF)
			case r.rerr == io.EOF:
				return nil, r.fail(io.ErrUnexpectedEOF)
			case errors.Is(r.rerr, ErrFrameTooLarge), errors.Is(r.rerr, ErrOverBudget):
				return nil, r.fail(r.rerr)
			}
			return nil, r.fail(fmt.Errorf("stream: reading watch response: %w", r.rerr))
		}
		r.fill()
	}
}

func (r *Reader) fail(err error) error {
	r.err = err
	r.ev = Event{}
	r.release()
	r.putState()
	return err
}

// release gives a pooled buffer back once nothing in it is needed any more: the Event
// returned last still points into it, so it is called only when Next fails for good (the
// caller gets no Event then) or from fill, before the buffer's bytes are overwritten anyway.
func (r *Reader) release() {
	if r.pooled != nil {
		busyPool.Put(r.pooled)
		r.pooled = nil
	}
	r.buf, r.start, r.end = nil, 0, 0
	r.charge(0)
}

// charge makes what the budget holds for the Reader n bytes, and reports whether it may: a
// refused Reader keeps what it held.
func (r *Reader) charge(n int) bool {
	if r.budget == nil || n == r.charged {
		return true
	}
	if n < r.charged {
		r.budget.Give(r.charged - n)
		r.charged = n
		return true
	}
	if !r.budget.Take(n - r.charged) {
		return false
	}
	r.charged = n
	return true
}

var busyPool = sync.Pool{New: func() any { b := make([]byte, busyBufSize); return &b }}

// fill reads once into the buffer's free space, making room first by compacting or growing it
// (never beyond one frame), and records what Read returned.
func (r *Reader) fill() {
	limit := r.max + frameSlack
	if r.start == r.end {
		// At a frame boundary nothing in the buffer is needed any more.
		r.start, r.end = 0, 0
		// A Reader about to wait holds only its idle buffer: a busy one goes back to the pool,
		// one grown for a big frame to the collector (and its budget), or every watch that once
		// saw a big frame would hold it while quiet, maybe for hours.
		if r.short && len(r.buf) > len(r.idle) || len(r.buf) > busyBufSize && r.small >= shrinkAfter {
			r.release()
		}
		if r.short {
			r.putState() // the Read is likely to wait: nothing of a frame is begun
			// The last Event is spent (Next was called again): while the watch waits, its
			// strings keep no block of strings alive (strings.go).
			r.ev = Event{}
		}
	}
	if r.buf == nil {
		if r.idle == nil {
			r.idle = make([]byte, min(idleBufSize, limit))
		}
		r.buf = r.idle
	}
	// An empty buffer takes a Read of any size: that is where the idle buffer waits for the
	// next event. A frame begun in it grows it.
	if r.end > 0 && len(r.buf)-r.end < minRead {
		if r.start > 0 {
			r.end = copy(r.buf, r.buf[r.start:r.end])
			r.start = 0
		}
		if len(r.buf)-r.end < minRead && len(r.buf) < limit {
			var nb []byte
			var pooled *[]byte
			n := max(2*len(r.buf), r.end+minRead)
			if n <= busyBufSize && limit >= busyBufSize {
				n = busyBufSize
			}
			n = min(n, limit)
			if !r.charge(n) {
				r.rerr = ErrOverBudget
				return
			}
			if n == busyBufSize {
				pooled = busyPool.Get().(*[]byte)
				nb = *pooled
			} else {
				nb = make([]byte, n)
			}
			copy(nb, r.buf[:r.end])
			if r.pooled != nil {
				busyPool.Put(r.pooled)
			}
			r.buf, r.pooled = nb, pooled
		}
	}
	if r.end == len(r.buf) {
		// The splitter reports an oversized frame before the buffer is full; this is a guard.
		r.rerr = ErrFrameTooLarge
		return
	}
	for range maxEmptyReads {
		n, err := r.src.Read(r.buf[r.end:])
		if n < 0 || n > len(r.buf)-r.end {
			r.rerr = fmt.Errorf("invalid Read count %d", n)
			return
		}
		r.short = r.end+n < len(r.buf)
		r.end += n
		if err != nil {
			r.rerr = err
			return
		}
		if n > 0 {
			return
		}
	}
	r.rerr = io.ErrNoProgress
}

// parse fills r.ev from one complete frame.
func (r *Reader) parse(raw []byte) error {
	ps := r.ps // taken for the split that found raw
	ps.reset(raw)
	var err error
	switch r.format {
	case JSON:
		err = ps.parseJSON(raw)
	case Protobuf:
		err = ps.parseProtobuf(raw)
	case CBOR:
		err = ps.parseCBOR(raw)
	}
	if err != nil {
		return err
	}
	ps.fill(&r.ev, raw, r.format)
	return nil
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}

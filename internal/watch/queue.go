package watch

import "unsafe"

// entryCost is what one frame costs a subscriber's queue beyond its bytes: its slice header.
// It is counted against --share-subscriber-buffer-bytes with the frame (member.push): the
// frames are shared among the subscribers, the entries are each one's own, so many subscribers
// of small events would otherwise hold far more than their bound says (docs/design.md section
// 11, "Bounds").
const entryCost = int(unsafe.Sizeof([]byte(nil)))

// queueBlockLen is how many frames a block of a member's queue holds: 64 entries, about 1.5
// KiB. A queue never holds more than its entries and a block's worth besides at each end,
// where an append-grown slice would hold up to twice its entries (and the old arrays until
// the next GC).
const queueBlockLen = 64

type queueBlock struct {
	f    [queueBlockLen][]byte
	next *queueBlock
}

// frameQueue is a member's queue of frames, oldest first: a list of fixed blocks, so it
// never holds more than it needs (queueBlockLen). The zero value is empty and holds nothing;
// so does a queue once emptied. Not safe for concurrent use: the member's mu guards it.
type frameQueue struct {
	head, tail *queueBlock
	hi, ti     int // the next to pop in head, the next free slot in tail
	n          int
}

func (q *frameQueue) len() int { return q.n }

func (q *frameQueue) push(b []byte) {
	if q.tail == nil || q.ti == queueBlockLen {
		nb := &queueBlock{}
		if q.tail == nil {
			q.head = nb
		} else {
			q.tail.next = nb
		}
		q.tail, q.ti = nb, 0
	}
	q.tail.f[q.ti] = b
	q.ti++
	q.n++
}

// pop takes the oldest frame; the queue is not empty.
func (q *frameQueue) pop() []byte {
	b := q.head.f[q.hi]
	q.head.f[q.hi] = nil
	q.hi++
	q.n--
	switch {
	case q.n == 0:
		*q = frameQueue{}
	case q.hi == queueBlockLen:
		q.head, q.hi = q.head.next, 0
	}
	return b
}

// peekUpTo counts the oldest frames whose bytes fit in limit (at least one, whatever its
// size, when the queue is not empty), and their bytes, without taking them.
func (q *frameQueue) peekUpTo(limit int) (k, bytes int) {
	b, i := q.head, q.hi
	for k < q.n {
		if i == queueBlockLen {
			b, i = b.next, 0
		}
		f := b.f[i]
		if k > 0 && bytes+len(f) > limit {
			break
		}
		k++
		bytes += len(f)
		i++
	}
	return k, bytes
}

// reset lets every frame go.
func (q *frameQueue) reset() { *q = frameQueue{} }

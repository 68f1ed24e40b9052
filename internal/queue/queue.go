package queue

import "unsafe"

// EntryCost is what one frame costs a subscriber's queue beyond its bytes: its slice header.
// It is counted against --share-subscriber-buffer-bytes with the frame (the member's push):
// the frames are shared among the subscribers, the entries are each one's own, so many
// subscribers of small events would otherwise hold far more than their bound says
// (docs/design.md section 11, "Bounds").
const EntryCost = int(unsafe.Sizeof([]byte(nil)))

// blockLen is how many frames a block of a queue holds: 64 entries, about 1.5 KiB. A queue
// never holds more than its entries and a block's worth besides at each end, where an
// append-grown slice would hold up to twice its entries (and the old arrays until the next GC).
const blockLen = 64

type block struct {
	f    [blockLen][]byte
	next *block
}

// Frames is a subscriber's queue of frames, oldest first: a list of fixed blocks, so it never
// holds more than it needs (blockLen). The zero value is empty and holds nothing; so does a
// queue once emptied. Not safe for concurrent use: its subscriber's lock guards it.
type Frames struct {
	head, tail *block
	hi, ti     int // the next to pop in head, the next free slot in tail
	n          int
}

// Len is how many frames are queued.
func (q *Frames) Len() int { return q.n }

// Push queues b after the others.
func (q *Frames) Push(b []byte) {
	if q.tail == nil || q.ti == blockLen {
		nb := &block{}
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

// Pop takes the oldest frame; the queue is not empty.
func (q *Frames) Pop() []byte {
	b := q.head.f[q.hi]
	q.head.f[q.hi] = nil
	q.hi++
	q.n--
	switch {
	case q.n == 0:
		*q = Frames{}
	case q.hi == blockLen:
		q.head, q.hi = q.head.next, 0
	}
	return b
}

// PeekUpTo counts the oldest frames whose bytes fit in limit (at least one, whatever its
// size, when the queue is not empty), and their bytes, without taking them.
func (q *Frames) PeekUpTo(limit int) (k, bytes int) {
	b, i := q.head, q.hi
	for k < q.n {
		if i == blockLen {
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

// Reset lets every frame go.
func (q *Frames) Reset() { *q = Frames{} }

package queue

import (
	"bytes"
	"fmt"
	"testing"
)

// Frames come out in the order they went in, across blocks; PeekUpTo counts the oldest that
// fit (one at least) without taking them; an emptied queue holds no block.
func TestFrames(t *testing.T) {
	var q Frames
	const n = 3*blockLen + 5
	frame := func(i int) []byte { return []byte(fmt.Sprintf("frame-%03d", i)) } // 9 bytes each
	for i := range n {
		q.Push(frame(i))
	}
	if q.Len() != n {
		t.Fatalf("len %d, want %d", q.Len(), n)
	}
	if k, b := q.PeekUpTo(9*blockLen + 4); k != blockLen || b != 9*blockLen {
		t.Fatalf("PeekUpTo a block's bytes: %d frames %d bytes, want %d %d", k, b, blockLen, 9*blockLen)
	}
	if k, b := q.PeekUpTo(1); k != 1 || b != 9 {
		t.Fatalf("PeekUpTo less than a frame: %d frames %d bytes, want 1 9", k, b)
	}
	if k, _ := q.PeekUpTo(1 << 20); k != n {
		t.Fatalf("PeekUpTo all: %d frames, want %d", k, n)
	}
	for i := range n - 1 {
		if got := q.Pop(); !bytes.Equal(got, frame(i)) {
			t.Fatalf("pop %d: %q", i, got)
		}
		if k, _ := q.PeekUpTo(1 << 20); k != n-1-i {
			t.Fatalf("after pop %d: PeekUpTo all %d, want %d", i, k, n-1-i)
		}
	}
	q.Pop()
	if q.Len() != 0 || q.head != nil || q.tail != nil {
		t.Fatalf("emptied: len %d, blocks held %v %v", q.Len(), q.head != nil, q.tail != nil)
	}
	if k, b := q.PeekUpTo(100); k != 0 || b != 0 {
		t.Fatalf("PeekUpTo on empty: %d %d", k, b)
	}
	q.Push(frame(1))
	q.Push(frame(2))
	q.Reset()
	if q.Len() != 0 || q.head != nil {
		t.Fatalf("reset: len %d", q.Len())
	}
}

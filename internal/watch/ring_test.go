package watch

import (
	"strings"
	"testing"
)

// The ring keeps the newest events within both bounds, and covers from the last one evicted.
func TestRingBounds(t *testing.T) {
	evicted := 0
	r := newRing(10, 30, 3, func() { evicted++ })
	for rv := uint64(11); rv <= 15; rv++ {
		r.add(rv, []byte(strings.Repeat("x", 10)))
	}
	if r.len() != 3 || r.start != 12 || evicted != 2 {
		t.Fatalf("len %d start %d evicted %d, want 3 12 2", r.len(), r.start, evicted)
	}
	if fr, n := r.after(13); len(fr) != 2 || n != 20 {
		t.Errorf("after 13: %d frames %d bytes, want 2 20", len(fr), n)
	}
	if fr, _ := r.after(15); len(fr) != 0 {
		t.Errorf("after the newest: %d frames, want none", len(fr))
	}
	// By bytes: one frame of 25 leaves room for nothing else.
	r.add(16, []byte(strings.Repeat("y", 25)))
	if r.len() != 1 || r.start != 15 || r.bytes != 25 {
		t.Errorf("after a big frame: len %d start %d bytes %d, want 1 15 25", r.len(), r.start, r.bytes)
	}
	// One bigger than the bound evicts itself too: the ring covers from it.
	r.add(17, []byte(strings.Repeat("z", 31)))
	if r.len() != 0 || r.start != 17 || r.bytes != 0 {
		t.Errorf("after a frame over the bound: len %d start %d bytes %d, want 0 17 0", r.len(), r.start, r.bytes)
	}
}

package ring

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
)

func newEvictions() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "evictions"}, []string{"cause"})
}

// The ring keeps the newest events within both bounds, and covers from the last one evicted.
func TestRingBounds(t *testing.T) {
	ev := newEvictions()
	r := New(10, 30, 3, nil, ev)
	for rv := uint64(11); rv <= 15; rv++ {
		r.Add(rv, []byte(strings.Repeat("x", 10)))
	}
	evicted := func() float64 {
		return promtest.ToFloat64(ev.WithLabelValues(EvictRingEvents)) + promtest.ToFloat64(ev.WithLabelValues(EvictRingBytes))
	}
	if n := evicted(); r.len() != 3 || r.start != 12 || n != 2 {
		t.Fatalf("len %d start %d evicted %v, want 3 12 2", r.len(), r.start, n)
	}
	if fr, n, ok := r.After(13); len(fr) != 2 || n != 20 || !ok {
		t.Errorf("after 13: %d frames %d bytes %v, want 2 20 true", len(fr), n, ok)
	}
	if fr, _, _ := r.After(15); len(fr) != 0 {
		t.Errorf("after the newest: %d frames, want none", len(fr))
	}
	if _, _, ok := r.After(11); ok {
		t.Errorf("after 11, older than the ring's start 12: covered")
	}
	// By bytes: one frame of 25 leaves room for nothing else.
	r.Add(16, []byte(strings.Repeat("y", 25)))
	if r.len() != 1 || r.start != 15 || r.bytes != 25 {
		t.Errorf("after a big frame: len %d start %d bytes %d, want 1 15 25", r.len(), r.start, r.bytes)
	}
	// One bigger than the bound evicts itself too: the ring covers from it.
	r.Add(17, []byte(strings.Repeat("z", 31)))
	if r.len() != 0 || r.start != 17 || r.bytes != 0 {
		t.Errorf("after a frame over the bound: len %d start %d bytes %d, want 0 17 0", r.len(), r.start, r.bytes)
	}
	if n := evicted(); n != 7 {
		t.Errorf("evictions %v, want 7", n)
	}
}

// The budget: a ring over its fair share evicts its own; one within it takes from the largest;
// a released ring gives its bytes back.
func TestRingBudget(t *testing.T) {
	ev := newEvictions()
	b := NewBudget(100, nil, nil)
	big := New(0, 1000, 1000, b, ev)
	small := New(0, 1000, 1000, b, ev)
	frame := []byte(strings.Repeat("x", 10))
	for rv := uint64(1); rv <= 10; rv++ {
		big.Add(rv, frame)
	}
	if b.total.Load() != 100 || promtest.ToFloat64(ev.WithLabelValues(EvictTotalOwn)) != 0 {
		t.Fatalf("at the total: %d bytes, %v evictions", b.total.Load(), promtest.ToFloat64(ev.WithLabelValues(EvictTotalOwn)))
	}
	// big holds 100, over its fair share of 50: its own add evicts its own oldest.
	big.Add(11, frame)
	if big.bytes != 100 || big.start != 1 || promtest.ToFloat64(ev.WithLabelValues(EvictTotalOwn)) != 1 {
		t.Fatalf("big over its share: %d bytes from %d, %v own evictions; want 100 from 1, 1", big.bytes, big.start, promtest.ToFloat64(ev.WithLabelValues(EvictTotalOwn)))
	}
	// small, within its share, takes from the largest.
	for rv := uint64(1); rv <= 5; rv++ {
		small.Add(rv, frame)
	}
	if small.bytes != 50 || big.bytes != 50 || big.start != 6 || b.total.Load() != 100 {
		t.Fatalf("small within its share: small %d, big %d from %d, total %d; want 50, 50 from 6, 100", small.bytes, big.bytes, big.start, b.total.Load())
	}
	if n := promtest.ToFloat64(ev.WithLabelValues(EvictTotalLargest)); n != 5 {
		t.Fatalf("evictions from the largest %v, want 5", n)
	}
	if fr, _, ok := big.After(5); ok || fr != nil {
		t.Fatalf("big after 5: covered, though the budget evicted up to 6")
	}
	big.Release()
	if b.total.Load() != 50 || len(b.rings) != 1 {
		t.Fatalf("after a release: total %d, %d rings; want 50, 1", b.total.Load(), len(b.rings))
	}
	for rv := uint64(6); rv <= 10; rv++ {
		small.Add(rv, frame)
	}
	if small.bytes != 100 || small.start != 0 {
		t.Fatalf("alone in the budget: small %d bytes from %d, want 100 from 0", small.bytes, small.start)
	}
}

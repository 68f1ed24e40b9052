package watch

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/watchsan/watchsan/internal/testutil"
)

func newEvictions() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "evictions"}, []string{"cause"})
}

// The ring keeps the newest events within both bounds, and covers from the last one evicted.
func TestRingBounds(t *testing.T) {
	ev := newEvictions()
	r := newRing(10, 30, 3, nil, ev)
	for rv := uint64(11); rv <= 15; rv++ {
		r.add(rv, []byte(strings.Repeat("x", 10)))
	}
	evicted := func() float64 {
		return promtest.ToFloat64(ev.WithLabelValues(evictRingEvents)) + promtest.ToFloat64(ev.WithLabelValues(evictRingBytes))
	}
	if n := evicted(); r.len() != 3 || r.start != 12 || n != 2 {
		t.Fatalf("len %d start %d evicted %v, want 3 12 2", r.len(), r.start, n)
	}
	if fr, n, ok := r.after(13); len(fr) != 2 || n != 20 || !ok {
		t.Errorf("after 13: %d frames %d bytes %v, want 2 20 true", len(fr), n, ok)
	}
	if fr, _, _ := r.after(15); len(fr) != 0 {
		t.Errorf("after the newest: %d frames, want none", len(fr))
	}
	if _, _, ok := r.after(11); ok {
		t.Errorf("after 11, older than the ring's start 12: covered")
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
	if n := evicted(); n != 7 {
		t.Errorf("evictions %v, want 7", n)
	}
}

// The budget: a ring over its fair share evicts its own; one within it takes from the largest;
// a released ring gives its bytes back.
func TestRingBudget(t *testing.T) {
	ev := newEvictions()
	b := newRingBudget(100, nil)
	big := newRing(0, 1000, 1000, b, ev)
	small := newRing(0, 1000, 1000, b, ev)
	frame := []byte(strings.Repeat("x", 10))
	for rv := uint64(1); rv <= 10; rv++ {
		big.add(rv, frame)
	}
	if b.total.Load() != 100 || promtest.ToFloat64(ev.WithLabelValues(evictTotalOwn)) != 0 {
		t.Fatalf("at the total: %d bytes, %v evictions", b.total.Load(), promtest.ToFloat64(ev.WithLabelValues(evictTotalOwn)))
	}
	// big holds 100, over its fair share of 50: its own add evicts its own oldest.
	big.add(11, frame)
	if big.bytes != 100 || big.start != 1 || promtest.ToFloat64(ev.WithLabelValues(evictTotalOwn)) != 1 {
		t.Fatalf("big over its share: %d bytes from %d, %v own evictions; want 100 from 1, 1", big.bytes, big.start, promtest.ToFloat64(ev.WithLabelValues(evictTotalOwn)))
	}
	// small, within its share, takes from the largest.
	for rv := uint64(1); rv <= 5; rv++ {
		small.add(rv, frame)
	}
	if small.bytes != 50 || big.bytes != 50 || big.start != 6 || b.total.Load() != 100 {
		t.Fatalf("small within its share: small %d, big %d from %d, total %d; want 50, 50 from 6, 100", small.bytes, big.bytes, big.start, b.total.Load())
	}
	if n := promtest.ToFloat64(ev.WithLabelValues(evictTotalLargest)); n != 5 {
		t.Fatalf("evictions from the largest %v, want 5", n)
	}
	if fr, _, ok := big.after(5); ok || fr != nil {
		t.Fatalf("big after 5: covered, though the budget evicted up to 6")
	}
	big.release()
	if b.total.Load() != 50 || len(b.rings) != 1 {
		t.Fatalf("after a release: total %d, %d rings; want 50, 1", b.total.Load(), len(b.rings))
	}
	for rv := uint64(6); rv <= 10; rv++ {
		small.add(rv, frame)
	}
	if small.bytes != 100 || small.start != 0 {
		t.Fatalf("alone in the budget: small %d bytes from %d, want 100 from 0", small.bytes, small.start)
	}
}

// The audit's case: 20 watches of one busy scope, each with a parameter of its own (an unknown
// one splits feeds, as it must), are 20 feeds with 20 rings. Together they hold at most
// --share-ring-total-bytes, each serving its subscriber every event; without the total they
// would hold 20 rings' worth.
func TestShareRingTotalBound(t *testing.T) {
	const (
		feeds     = 20
		ringBytes = 256 << 10
		total     = 1 << 20 // four rings' worth for 20
		events    = 200     // of about 2 KiB: 400 KiB a feed, its ring full
	)
	x := newShareFixture(t, Config{ShareRingBytes: ringBytes, ShareRingTotalBytes: total})
	from := x.write(t, "before", 1, 10)
	clients := make([]*client, feeds)
	for i := range clients {
		clients[i] = watchAt(t, x.srv.URL, fmt.Sprintf("resourceVersion=%d&dummy=%d", from, i), nil, true)
	}
	x.waitSubscribers(t, feeds)
	if got := promtest.ToFloat64(x.m.SharedFeeds); got != feeds {
		t.Fatalf("%v shared feeds, want %d", got, feeds)
	}
	peak := 0.0
	data := strings.Repeat("x", 2000)
	for i := 0; i < events; i++ {
		body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"busy-%d"},"data":{"k":%q}}`, i, data)
		if err := x.send(http.MethodPost, "/api/v1/namespaces/d/configmaps", body, http.StatusCreated); err != nil {
			t.Fatal(err)
		}
		peak = max(peak, promtest.ToFloat64(x.m.SharedRingBytes))
	}
	for i, c := range clients {
		c.waitFor(t, fmt.Sprintf("client %d", i), events)
	}
	var held int
	x.h.feeds.mu.Lock()
	for _, sf := range x.h.feeds.feeds {
		_, n, _, _ := sf.ring.stats()
		held += n
	}
	x.h.feeds.mu.Unlock()
	peak = max(peak, promtest.ToFloat64(x.m.SharedRingBytes))
	t.Logf("%d feeds of %d events of about 2 KiB: rings hold %d bytes (gauge peak %v), total %d; evictions %v own, %v from the largest, %v by a ring's own bound",
		feeds, events, held, peak, total, promtest.ToFloat64(x.m.SharedRingEvictions.WithLabelValues(evictTotalOwn)),
		promtest.ToFloat64(x.m.SharedRingEvictions.WithLabelValues(evictTotalLargest)), promtest.ToFloat64(x.m.SharedRingEvictions.WithLabelValues(evictRingBytes)))
	// A frame may pass the total while its add evicts for it (one per feed adding at once).
	if held > total || peak > total+feeds*2100 {
		t.Fatalf("rings hold %d bytes (the gauge's peak %v), over the total %d", held, peak, total)
	}
	if got := promtest.ToFloat64(x.m.SharedRingBytes); int(got) != held {
		t.Fatalf("watchsan_shared_feed_ring_bytes %v, the rings hold %d", got, held)
	}
	if promtest.ToFloat64(x.m.SharedRingEvictions.WithLabelValues(evictTotalOwn))+promtest.ToFloat64(x.m.SharedRingEvictions.WithLabelValues(evictTotalLargest)) == 0 {
		t.Fatal("no eviction for the total")
	}
	// Every feed still covers its recent events: a client re-watching from one joins.
	last := x.api.ResourceVersion()
	late := watchAt(t, x.srv.URL, fmt.Sprintf("resourceVersion=%d&dummy=0", last-5), nil, true)
	late.waitFor(t, "a joiner from 5 events back", 5)
	if got := promtest.ToFloat64(x.m.SharedJoins); got < 1 {
		t.Fatalf("joins %v: a client from 5 events back did not join its feed", got)
	}
	// Feeds that end give their rings' bytes back.
	x.shutdown()
	testutil.Eventually(t, 10*time.Second, "the rings' bytes given back", func() bool { return promtest.ToFloat64(x.m.SharedRingBytes) == 0 })
}

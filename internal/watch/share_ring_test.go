package watch

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/watchsan/watchsan/internal/ring"
	"github.com/watchsan/watchsan/internal/testutil"
)

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
		_, n, _, _ := sf.ring.Stats()
		held += n
	}
	x.h.feeds.mu.Unlock()
	peak = max(peak, promtest.ToFloat64(x.m.SharedRingBytes))
	t.Logf("%d feeds of %d events of about 2 KiB: rings hold %d bytes (gauge peak %v), total %d; evictions %v own, %v from the largest, %v by a ring's own bound",
		feeds, events, held, peak, total, promtest.ToFloat64(x.m.SharedRingEvictions.WithLabelValues(ring.EvictTotalOwn)),
		promtest.ToFloat64(x.m.SharedRingEvictions.WithLabelValues(ring.EvictTotalLargest)), promtest.ToFloat64(x.m.SharedRingEvictions.WithLabelValues(ring.EvictRingBytes)))
	// A frame may pass the total while its add evicts for it (one per feed adding at once).
	if held > total || peak > total+feeds*2100 {
		t.Fatalf("rings hold %d bytes (the gauge's peak %v), over the total %d", held, peak, total)
	}
	if got := promtest.ToFloat64(x.m.SharedRingBytes); int(got) != held {
		t.Fatalf("watchsan_shared_feed_ring_bytes %v, the rings hold %d", got, held)
	}
	if promtest.ToFloat64(x.m.SharedRingEvictions.WithLabelValues(ring.EvictTotalOwn))+promtest.ToFloat64(x.m.SharedRingEvictions.WithLabelValues(ring.EvictTotalLargest)) == 0 {
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

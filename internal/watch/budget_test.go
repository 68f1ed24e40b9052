package watch

import (
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/watchsan/watchsan/internal/budget"
	"github.com/watchsan/watchsan/internal/testutil"
)

// A feed whose next frame the memory budget cannot afford ends (EndMemory) and its clients
// re-watch, instead of the process growing past the budget; once memory is there again the
// re-watch gets the event. Everything the feed and its subscriber held goes back.
func TestMemoryBudgetEndsAFeedItCannotAfford(t *testing.T) {
	mem := budget.New(16 << 20)
	x := newShareFixtureBudget(t, Config{}, nil, mem)
	from := x.write(t, "before", 1, 10)
	c := watchAt(t, x.srv.URL, "resourceVersion="+rv(from), nil, true)
	x.waitSubscribers(t, 1)

	others := mem.Open() // what every other client holds: the budget is nearly spent
	if !others.Take(budget.Frames, 13<<20) {
		t.Fatal("the budget refused the others' 13 MiB")
	}
	mem.Charge(budget.States, 2<<20)
	big := x.write(t, "big", 1, 2<<20)
	ended := func() float64 { return promtest.ToFloat64(x.m.StreamEnds.WithLabelValues(EndMemory.String())) }
	testutil.Eventually(t, 20*time.Second, "the subscriber's stream to end for the memory budget", func() bool { return ended() >= 1 })
	select {
	case <-c.ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the client's stream is still open after its feed ended for the memory budget")
	}
	for _, ev := range c.events() {
		if ev == "ADDED big-0 "+rv(big) {
			t.Fatalf("the client got the frame the budget refused: %v", c.events())
		}
	}
	others.Close()
	mem.Charge(budget.States, -2<<20)

	// The client re-watches from its last resourceVersion, and now gets it.
	again := watchAt(t, x.srv.URL, "resourceVersion="+rv(from), nil, true)
	if got := again.waitFor(t, "the re-watch", 1); got[0] != "ADDED big-0 "+rv(big) {
		t.Fatalf("the re-watch got %v, want the big configmap at %d", got, big)
	}
	again.cancel()
	testutil.Eventually(t, 20*time.Second, "the budget to hold nothing once every watch ended", func() bool {
		return promtest.ToFloat64(x.m.SharedSubscribers) == 0 && mem.Used() == 0
	})
}

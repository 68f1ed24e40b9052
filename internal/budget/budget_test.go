package budget

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
)

func TestTotalIsNeverPassed(t *testing.T) {
	b := New(16 << 20)
	a, c := b.Open(), b.Open()
	if !a.Take(Frames, 10<<20) {
		t.Fatal("10 MiB of 16 refused")
	}
	if c.Take(Queues, 7<<20) {
		t.Fatal("7 MiB more granted: the total would be passed")
	}
	if got := b.Used(); got != 10<<20 {
		t.Fatalf("a refusal left %d bytes held, want 10 MiB", got)
	}
	a.Give(Frames, 10<<20)
	if !c.Take(Queues, 7<<20) {
		t.Fatal("7 MiB refused once the 10 were given back")
	}
}

// Past the high mark the client over its fair share is refused, the others are not: the one
// that holds the most is ended before the total is reached.
func TestFairSharePastTheHighMark(t *testing.T) {
	b := New(16 << 20) // high mark 14 MiB; 4 accounts: fair share 4 MiB
	big := b.Open()
	small := []*Account{b.Open(), b.Open(), b.Open()}
	if !big.Take(Frames, 13<<20) {
		t.Fatal("13 MiB refused below the high mark")
	}
	if big.Take(Frames, 2<<20) {
		t.Fatal("the account over its fair share took more past the high mark")
	}
	for i, s := range small { // 14.5, 15.5, 16 MiB held: each past the high mark
		if !s.Take(Queues, int64(1536-i*1024+i*512)<<10) {
			t.Fatalf("account %d, within its share, refused past the high mark", i)
		}
	}
	want := map[string]float64{"frames/share": 1}
	for k, n := range want {
		kind, why, _ := strings.Cut(k, "/")
		if got := refusals(t, b, kind, why); got != n {
			t.Errorf("refusals{holder=%s,why=%s} = %v, want %v", kind, why, got, n)
		}
	}
}

func TestCloseGivesBackWhatIsLeft(t *testing.T) {
	b := New(16 << 20)
	a := b.Open()
	a.Take(Frames, 1<<20)
	a.Take(Writers, 64<<10)
	a.Close()
	if got := b.Used(); got != 0 {
		t.Fatalf("%d bytes held after the only account closed", got)
	}
	a.Give(Frames, 1<<20) // the holder lets its buffer go after its client ended
	if got := b.Used(); got != 0 {
		t.Fatalf("a Give after Close moved the total to %d", got)
	}
	if a.Take(Frames, 1) {
		t.Fatal("a closed account took bytes")
	}
	if n := promtest.ToFloat64(accounts(b)); n != 0 {
		t.Fatalf("%v accounts open after the only one closed", n)
	}
}

// What serves many clients is refused at the total only, never for a share, never asked to
// end, and divides no one's share.
func TestCommonAccount(t *testing.T) {
	b := New(16 << 20)
	feed := b.OpenCommon()
	ended := make(chan struct{}, 1)
	client := b.OpenEnding(func() { ended <- struct{}{} })
	if !client.Take(Queues, 1<<20) || !feed.Take(Frames, 14<<20) {
		t.Fatal("refused below the total")
	}
	// 15 MiB: past the high mark; the client (1 MiB) is within its share of 14 MiB, the
	// feed (14 MiB) over any, and neither is asked to end.
	select {
	case <-ended:
		t.Fatal("the client within its share asked to end")
	case <-time.After(100 * time.Millisecond):
	}
	if !feed.Take(Frames, 512<<10) {
		t.Fatal("the feed refused its share past the high mark, under the total")
	}
	if feed.Take(Frames, 1<<20) {
		t.Fatal("the feed took past the total")
	}
	feed.Close()
	if n := b.accounts.Load(); n != 1 {
		t.Fatalf("%d accounts divide the share, want the client's 1", n)
	}
}

// Force counts past the total, and the account forced over its share is asked to end.
func TestForce(t *testing.T) {
	b := New(16 << 20)
	ended := make(chan struct{}, 1)
	a := b.OpenEnding(func() { ended <- struct{}{} })
	other := b.Open()
	a.Force(Queues, 20<<20)
	if b.Used() != 20<<20 || a.Held() != 20<<20 {
		t.Fatalf("forced 20 MiB: budget holds %d, the account %d", b.Used(), a.Held())
	}
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the account forced past the total was not asked to end")
	}
	if other.Take(Queues, 1) {
		t.Fatal("a take past the total granted")
	}
	a.Close()
	if b.Used() != 0 {
		t.Fatalf("%d bytes held after the forced account closed", b.Used())
	}
}

func TestChargeAndShort(t *testing.T) {
	b := New(16 << 20)
	b.Charge(Rings, 15<<20)
	if !b.Short() {
		t.Fatal("15 MiB of 16 is not short")
	}
	b.Charge(Rings, -2<<20)
	if b.Short() {
		t.Fatal("13 MiB of 16 is short")
	}
	var nilB *Budget
	var nilA *Account
	if !nilB.Take(Rings, 1<<40) || !nilA.Take(Frames, 1<<40) || nilB.Short() || nilB.Open() != nil {
		t.Fatal("a nil budget or account refused or counted")
	}
}

func TestConcurrentAccountsBalance(t *testing.T) {
	b := New(16 << 20)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := b.Open()
			defer a.Close()
			for j := 0; j < 1000; j++ {
				if a.Take(Queues, 24) && j%2 == 0 {
					a.Give(Queues, 24)
				}
			}
		}()
	}
	wg.Wait()
	if got := b.Used(); got != 0 {
		t.Fatalf("%d bytes held after every account closed", got)
	}
}

func refusals(t *testing.T, b *Budget, holder, why string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(b)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "watchsan_memory_budget_refusals_total" {
			continue
		}
		for _, m := range mf.Metric {
			l := map[string]string{}
			for _, p := range m.Label {
				l[p.GetName()] = p.GetValue()
			}
			if l["holder"] == holder && l["why"] == why {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func accounts(b *Budget) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "a"}, func() float64 { return float64(b.accounts.Load()) })
}

// A watch asks for a frame's buffer; past the high mark, the client holding the most is
// refused, and ends.
func Example() {
	b := New(64 << 20)
	w1, w2 := b.Open(), b.Open()
	defer w1.Close()
	defer w2.Close()
	fmt.Println(w1.Take(Frames, 50<<20)) // below the high mark (56 MiB): granted
	fmt.Println(w1.Take(Frames, 8<<20))  // past it, and over its share (28 MiB): refused
	fmt.Println(w2.Take(Queues, 4<<20))  // past it, within its share: granted
	// Output:
	// true
	// false
	// true
}

// Past the high mark the accounts over their fair share are asked to end, once, the others not,
// and no more are asked before those closed.
func TestPastTheHighMarkThoseOverTheirShareAreAskedToEnd(t *testing.T) {
	b := New(16 << 20) // high mark 14 MiB
	ended := make(chan string, 4)
	big := b.OpenEnding(func() { ended <- "big" })
	mid := b.OpenEnding(func() { ended <- "mid" })
	small := b.OpenEnding(func() { ended <- "small" })
	big.Take(Frames, 9<<20)
	mid.Take(Frames, 4<<20) // 13 MiB held; fair share 5.33 MiB
	select {
	case who := <-ended:
		t.Fatalf("%s asked to end below the high mark", who)
	default:
	}
	if !small.Take(Queues, 3<<19) { // 14.5 MiB: past the high mark, within its share
		t.Fatal("the small account was refused")
	}
	select {
	case who := <-ended:
		if who != "big" {
			t.Fatalf("%s asked to end, want the largest", who)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no account asked to end past the high mark")
	}
	small.Take(Queues, 1) // still past it: no second ask while the first has not closed
	big.Close()
	small.Take(Queues, 1) // 5.5 MiB held: below the high mark, nothing asked
	select {
	case who := <-ended:
		t.Fatalf("%s asked to end with the total below the high mark", who)
	case <-time.After(100 * time.Millisecond):
	}
	if n := b.evicted.Load(); n != 1 {
		t.Fatalf("%d accounts asked to end, want 1", n)
	}
}

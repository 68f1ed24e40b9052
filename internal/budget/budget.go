// Package budget is the one memory budget of a watchsan process. Everything that grows with
// load - subscribers' queues, frames being read, write buffers, shared feeds' rings, watches'
// 410 states - takes its bytes from it before it holds them and gives them back when it lets
// them go, so their sum has a bound, not only each of them (docs/design.md section 15).
//
// A client (a watch, a shared subscriber, a feed) holds its bytes through an Account. Below
// the high mark (seven eighths of the total) any account may take what its own bounds allow;
// above it, an account that would hold more than its fair share (the high mark over the open
// accounts) is refused, so the clients that hold the most are ended - as the apiserver ends a
// watcher that cannot keep up - before the total is reached and before anyone else is: past
// the high mark, every account over its fair share that has a way to end (OpenEnding) is asked
// to (relieve).
package budget

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultBytes is the total where the container's memory limit is not known: 64 MiB. With
// Go's default collector a heap may grow to twice what is live before a collection, and no
// soft limit is set without a container's, so this keeps what grows with load within about
// 150 MiB of resident memory; a deployment with a limit gets half of it.
const DefaultBytes = 64 << 20

// Kind is what holds the bytes: a label of the metrics, nothing more.
type Kind int

const (
	// Queues: shared subscribers' queue entries (the frames are the feed's).
	Queues Kind = iota
	// Frames: watch frames being read (stream.Reader's buffers beyond its idle one).
	Frames
	// Writers: write buffers toward clients.
	Writers
	// Rings: shared feeds' rings of recent events.
	Rings
	// States: watches' states kept to absorb a 410, and absorbs' lists.
	States
	// Reads: coalesced upstream reads' answers, buffered for their members (package
	// coalesce), which give way while memory is Short by ending their lagging members.
	Reads
	numKinds
)

var kindNames = [numKinds]string{"queues", "frames", "writers", "rings", "states", "reads"}

func (k Kind) String() string { return kindNames[k] }

// Budget is the total. A nil *Budget refuses nothing and counts nothing.
type Budget struct {
	max, high int64
	used      atomic.Int64
	accounts  atomic.Int64
	held      [numKinds]atomic.Int64
	// refused counts refusals by kind: [k][0] at the total, [k][1] over a fair share.
	refused [numKinds][2]atomic.Int64

	// open are the accounts with an end to ask of (OpenEnding); evicting is set while relieve
	// scans them, pending counts those asked to end that have not closed yet, evicted all
	// those ever asked.
	mu       sync.Mutex
	open     map[*Account]struct{}
	evicting atomic.Bool
	pending  atomic.Int64 // asked to end, not closed yet
	lastScan atomic.Int64 // when relieveLater last started a scan, unix nanoseconds
	evicted  atomic.Int64

	maxDesc, heldDesc, refusedDesc, accountsDesc, endedDesc *prometheus.Desc
}

// New returns a budget of max bytes (at least 1 MiB).
func New(max int64) *Budget {
	max = maxInt(max, 1<<20)
	return &Budget{
		max:  max,
		high: max - max/8,
		open: map[*Account]struct{}{},
		maxDesc: prometheus.NewDesc("watchsan_memory_budget_bytes",
			"The memory budget's total (--memory-budget-bytes): what queues, frames being read, write buffers, rings, 410 states and coalesced reads may hold together.", nil, nil),
		heldDesc: prometheus.NewDesc("watchsan_memory_budget_held_bytes",
			"Bytes of the memory budget held, by holder (queues, frames, writers, rings, states, reads).", []string{"holder"}, nil),
		refusedDesc: prometheus.NewDesc("watchsan_memory_budget_refusals_total",
			"Requests for memory the budget refused, by holder and why: total (the budget was full) or share (past the high mark, the client held more than its fair share). A refused watch or subscriber is ended; its client re-watches.", []string{"holder", "why"}, nil),
		endedDesc: prometheus.NewDesc("watchsan_memory_budget_ended_total",
			"Watches and subscribers asked to end because, past the budget's high mark, they held the most beyond their fair share; their clients re-watch.", nil, nil),
		accountsDesc: prometheus.NewDesc("watchsan_memory_budget_accounts",
			"Clients and feeds holding an account of the memory budget; the fair share past the high mark is the total over this.", nil, nil),
	}
}

func maxInt(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// Max is the total; 0 for a nil budget.
func (b *Budget) Max() int64 {
	if b == nil {
		return 0
	}
	return b.max
}

// Used is what is held now.
func (b *Budget) Used() int64 {
	if b == nil {
		return 0
	}
	return b.used.Load()
}

// Take reserves n bytes of kind k held by no client in particular (a ring is bounded by its
// own rules): refused only when the total would pass the budget.
func (b *Budget) Take(k Kind, n int64) bool {
	if b == nil || n <= 0 {
		return true
	}
	if b.used.Add(n) > b.max {
		b.used.Add(-n)
		b.refused[k][0].Add(1)
		return false
	}
	b.held[k].Add(n)
	return true
}

// Give returns n bytes of kind k taken with Take.
func (b *Budget) Give(k Kind, n int64) {
	if b == nil || n <= 0 {
		return
	}
	b.used.Add(-n)
	b.held[k].Add(-n)
}

// Charge counts n bytes of kind k (n < 0: gives them back) that a holder keeps whatever the
// budget says, and gives way for instead when memory is Short: a shared feed's ring, a cache
// of recent events, evicts its oldest.
func (b *Budget) Charge(k Kind, n int64) {
	if b == nil || n == 0 {
		return
	}
	b.used.Add(n)
	b.held[k].Add(n)
	if n > 0 && b.used.Load() > b.high {
		b.relieveLater()
	}
}

// Short says whether what is held is past the high mark: holders that can give way (Charge)
// should.
func (b *Budget) Short() bool {
	return b != nil && b.used.Load() > b.high
}

// Open opens a client's account. Close it when the client ends.
func (b *Budget) Open() *Account { return b.OpenEnding(nil) }

// OpenCommon opens the account of what serves many clients at once (a shared feed): refused
// only at the total, never asked to end, and not one of the accounts a fair share divides the
// high mark among. Its bytes are those of every client it serves; a share of one client's
// would end them all (a feed's 64 KiB read buffer is over the share of each of 1,000
// subscribers, whose queues are their own accounts).
func (b *Budget) OpenCommon() *Account {
	if b == nil {
		return nil
	}
	return &Account{b: b, common: true}
}

// OpenEnding opens a client's account with a way to end the client (nil: none): past the
// high mark, every account holding more than its fair share is asked to end (once, on a
// goroutine of its own), so what they hold comes back before others are refused at the total;
// end must make the client close its account soon, and must not wait on anything of the
// budget's.
func (b *Budget) OpenEnding(end func()) *Account {
	if b == nil {
		return nil
	}
	b.accounts.Add(1)
	a := &Account{b: b, end: end}
	if end != nil {
		b.mu.Lock()
		b.open[a] = struct{}{}
		b.mu.Unlock()
	}
	return a
}

// relieve asks every account holding more than its fair share to end, unless some asked
// before have not closed yet (a scan per round of ends, not per Take). Called past the high
// mark, and when an account within its share is refused at the total: the ones over their
// share go, so that one within it is served next time. All at once, not the largest alone: a
// round of one lets the others keep the budget full while clients within their share are
// refused (20 watches each sent a 10 MB frame kept a reading client from its first 64 KiB).
func (b *Budget) relieve() {
	if b.pending.Load() > 0 || !b.evicting.CompareAndSwap(false, true) {
		return
	}
	defer b.evicting.Store(false)
	fair := b.fair()
	var victims []*Account
	b.mu.Lock()
	for a := range b.open {
		if a.heldNow() > fair {
			victims = append(victims, a)
			delete(b.open, a) // asked once
			a.ending.Store(true)
		}
	}
	b.pending.Add(int64(len(victims)))
	b.mu.Unlock()
	b.evicted.Add(int64(len(victims)))
	for _, a := range victims {
		go a.end()
	}
}

// Account is what one client holds of the budget. A nil *Account refuses nothing. Its methods
// are safe for concurrent use.
type Account struct {
	b      *Budget
	common bool   // OpenCommon's
	end    func() // OpenEnding's; nil: never asked
	mu     sync.Mutex
	held   [numKinds]int64
	total  int64
	closed bool
	// ending: asked to end by relieve; its Close lets the next one be asked. published is
	// total, stored whenever it changes.
	ending    atomic.Bool
	published atomic.Int64
}

// heldNow is total, read without mu (relieve holds the budget's lock, never an account's).
func (a *Account) heldNow() int64 { return a.published.Load() }

// Take reserves n bytes of kind k for the account: refused when the total would pass the
// budget, or when it would pass the high mark and the account would hold more than its fair
// share, or once the account is closed. A refused client is to be ended, the way the
// apiserver ends a watcher that cannot keep up: what it asked for would have come out of every
// other client's memory.
func (a *Account) Take(k Kind, n int64) bool {
	if a == nil || n <= 0 {
		return true
	}
	b := a.b
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false
	}
	used := b.used.Add(n)
	switch {
	case used > b.max:
		b.used.Add(-n)
		b.refused[k][0].Add(1)
		b.relieveLater()
		return false
	case used > b.high && !a.common && a.total+n > b.fair():
		b.used.Add(-n)
		b.refused[k][1].Add(1)
		return false
	}
	a.held[k] += n
	a.total += n
	a.published.Store(a.total)
	b.held[k].Add(n)
	if used > b.high {
		b.relieveLater()
	}
	return true
}

// fair is an account's fair share: the high mark over the accounts open. Of the high mark, not
// the total: when every account holds its share, the eighth above the high mark is still there
// for a client that just came (a watch's first 64 KiB), while relieve ends those now over it.
func (b *Budget) fair() int64 { return b.high / maxInt(b.accounts.Load(), 1) }

// relieveLater runs relieve off the caller's locks (an account's Take may hold its holder's).
// At most one scan per relieveEvery: Takes past the high mark come from every subscriber's
// queue on every event, and a scan is over every account; one that found no one to end would
// otherwise be repeated at each of them.
func (b *Budget) relieveLater() {
	if b.evicting.Load() || b.pending.Load() > 0 {
		return
	}
	now := time.Now().UnixNano()
	last := b.lastScan.Load()
	if now-last < int64(relieveEvery) || !b.lastScan.CompareAndSwap(last, now) {
		return
	}
	go b.relieve()
}

// relieveEvery spaces relieve's scans.
const relieveEvery = 50 * time.Millisecond

// Force counts n bytes of kind k for the account whatever the budget says: for what refusing
// would cost more than holding (a joining subscriber's backlog, which refused would become an
// upstream watch of its own). Past the high mark the account may then be asked to end.
func (a *Account) Force(k Kind, n int64) {
	if a == nil || n <= 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return
	}
	used := a.b.used.Add(n)
	a.held[k] += n
	a.total += n
	a.published.Store(a.total)
	a.b.held[k].Add(n)
	if used > a.b.high {
		a.b.relieveLater()
	}
}

// Give returns n bytes of kind k the account took; after Close, nothing (Close gave back all).
func (a *Account) Give(k Kind, n int64) {
	if a == nil || n <= 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return
	}
	n = min(n, a.held[k])
	a.held[k] -= n
	a.total -= n
	a.published.Store(a.total)
	a.b.used.Add(-n)
	a.b.held[k].Add(-n)
}

// Held is what the account holds now.
func (a *Account) Held() int64 {
	if a == nil {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.total
}

// Close ends the account: everything it still holds goes back to the budget (a holder that
// lost track of a buffer leaks nothing past its client's end), and later Takes are refused.
// A second Close does nothing.
func (a *Account) Close() {
	if a == nil {
		return
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	a.closed = true
	for k := range a.held {
		a.b.used.Add(-a.held[k])
		a.b.held[k].Add(-a.held[k])
		a.held[k] = 0
	}
	a.total = 0
	a.published.Store(0)
	a.mu.Unlock()
	if !a.common {
		a.b.accounts.Add(-1)
	}
	if a.end != nil { // the budget's lock after the account's, never inside it
		a.b.mu.Lock()
		delete(a.b.open, a)
		a.b.mu.Unlock()
		if a.ending.Load() {
			a.b.pending.Add(-1)
		}
	}
}

// Of binds the account to one kind, for a holder that knows nothing of kinds (stream.Reader's
// Budget): Take(n int) bool and Give(n int).
func (a *Account) Of(k Kind) KindAccount { return KindAccount{a: a, k: k} }

// KindAccount is an account's bytes of one kind.
type KindAccount struct {
	a *Account
	k Kind
}

// Take is Account.Take of the kind.
func (ka KindAccount) Take(n int) bool { return ka.a.Take(ka.k, int64(n)) }

// Give is Account.Give of the kind.
func (ka KindAccount) Give(n int) { ka.a.Give(ka.k, int64(n)) }

// Describe implements prometheus.Collector.
func (b *Budget) Describe(ch chan<- *prometheus.Desc) {
	ch <- b.maxDesc
	ch <- b.heldDesc
	ch <- b.refusedDesc
	ch <- b.accountsDesc
	ch <- b.endedDesc
}

// Collect implements prometheus.Collector.
func (b *Budget) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(b.maxDesc, prometheus.GaugeValue, float64(b.max))
	ch <- prometheus.MustNewConstMetric(b.accountsDesc, prometheus.GaugeValue, float64(b.accounts.Load()))
	ch <- prometheus.MustNewConstMetric(b.endedDesc, prometheus.CounterValue, float64(b.evicted.Load()))
	for k := Kind(0); k < numKinds; k++ {
		ch <- prometheus.MustNewConstMetric(b.heldDesc, prometheus.GaugeValue, float64(b.held[k].Load()), k.String())
		ch <- prometheus.MustNewConstMetric(b.refusedDesc, prometheus.CounterValue, float64(b.refused[k][0].Load()), k.String(), "total")
		ch <- prometheus.MustNewConstMetric(b.refusedDesc, prometheus.CounterValue, float64(b.refused[k][1].Load()), k.String(), "share")
	}
}

package watch

import (
	"net/http"
	"strconv"
	"sync"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/absorb"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/review"
	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/upstream"
)

// A shared feed's state (docs/design.md sections 11 and 12). A shared feed begins at
// a resourceVersion, never with the initial state, so it holds a complete state only when it
// is handed one that is complete at exactly the resourceVersion it starts from:
//   - a watch-list's handoff that opens the feed from its bookmark's L moves the private
//     feed's state, complete at L, onto it (the bytes stay counted, now as the shared feed's);
//   - a plain watch from X that opens the feed adopts the state parked under the same
//     stateKey at X, as a private feed would (absorb.Parked).
//
// Whose state: stateKey carries cred.Principal(), and the feed goes upstream as its opener's
// credentials (the lent identity, or the reviewed opener's own), which are the cred the key is
// made with here: a state is only ever handed to a feed that goes upstream as the principal
// whose watch of the same scope built it, so the apiserver would have sent it the same
// objects. Other subscribers of a reviewed feed were allowed the same watch by their review;
// what an absorb lists is then judged by absorbAdmit.
//
// From then on the feed's goroutine keeps the state as a private feed's (feed.pass calls
// observeState for every event it delivers, within the same budgets, dropped once over them),
// parks it when the feed ends (parkState) and absorbs a 410 with it (absorbGone), the
// synthesized events going through the shared sink to the ring and every member, with the
// ring made sound for joiners across the absorb (absorbBegin, absorbEnd). A handoff that
// joins an open feed changes nothing of that feed's state: the private feed's is freed.

// sharedState gives the shared feed sf, opened from resourceVersion rv by the watch r with
// cred, its state: moved (a handoff's, complete at rv, or nil) when given, else the one parked
// under r's stateKey at rv. The registry's lock is held; the feed's goroutine has not started.
func (h *Handler) sharedState(sf *sharedFeed, r *http.Request, cred upstream.Credentials, rv string, moved *absorb.State, why string) {
	f := sf.f
	switch {
	case h.cfg.DisableAbsorb:
		if moved != nil {
			moved.Free()
		}
		return
	case !wholeOrTable(r.Header.Get("Accept")):
		if moved != nil {
			moved.Free()
		}
		f.noState(absorb.Format)
		return
	}
	key := stateKey(r, f.query, cred)
	if moved == nil && why == "" {
		moved = h.parked.Adopt(key, rv)
		why = absorb.NotComplete // it began at a client's resourceVersion, and nothing was parked there
	}
	if moved == nil {
		f.noState(why)
		return
	}
	f.holdState(moved, key)
}

// stateFormat lets the state go when the feed's first answer is in a format absorbing does not
// read, or in another one than the state's frames (a handoff's or parked state was built from
// another stream). The feed's goroutine, at its first answer.
func (sf *sharedFeed) stateFormat() {
	sf.f.stateInFormat()
}

// parkState parks the feed's state, complete at its last delivered resourceVersion, for the
// next watch from there (absorb.Parked), as a private feed's release does; before the feed's
// members are ended, so that their re-watches (which open a new feed) find it. A feed whose
// first attempt failed delivered nothing and keeps nothing. The feed's goroutine.
func (sf *sharedFeed) parkState() {
	sf.f.parkState(sf.ok)
}

// handoffState is what a watch-list's private feed f hands a shared feed it opens: its state,
// complete at its bookmark, moved (f keeps none from then on: if the handoff then fails, f's
// later 410 is its client's), and why not when it has none.
func handoffState(f *feed) (*absorb.State, string) {
	return f.takeState()
}

// memberAccess is what a reviewed subscriber's access review was made with (package review), kept so
// that an absorb can ask whether it may list the scope too: its request's URL and headers (not
// the request: a detached member's handler returned), its identity and their digest.
type memberAccess struct {
	req  *http.Request
	info reqinfo.Info
	cred upstream.Credentials
	ck   review.CredKey
}

func newMemberAccess(r *http.Request, info *reqinfo.Info, cred upstream.Credentials, ck review.CredKey) *memberAccess {
	u := *r.URL
	req := &http.Request{Method: r.Method, URL: &u, Header: r.Header.Clone(), Host: r.Host, RemoteAddr: r.RemoteAddr,
		Proto: r.Proto, ProtoMajor: r.ProtoMajor, ProtoMinor: r.ProtoMinor}
	return &memberAccess{req: req, info: *info, cred: cred, ck: ck}
}

// absorbAdmit ends, each alone with the 410 st, the members of a reviewed feed whose
// credentials may not list its scope; the others keep the absorb. The absorb lists the scope as
// the feed's opener, and what it sends is a list's objects, while a reviewed subscriber was
// reviewed for watch only. The apiserver grants list and watch separately; RBAC roles almost
// always grant both, but a role with watch and no list exists, and its holder must not read
// through the feed what its own list would be refused: it gets the 410 a direct watch of its
// would get, and relists (refused, as it would be). Joins are blocked already (absorbBegin),
// so every member the absorb's events reach is one judged here (docs/design.md section 12).
// The lent identity is one identity: its opener and subscribers are the same user, and the list
// goes as it. Each credentials' review is a fresh one (package review), at most absorbReviews at once.
// The feed's goroutine.
func (sf *sharedFeed) absorbAdmit(st *metav1.Status) {
	if !sf.reviewed {
		return
	}
	g := sf.h.feeds
	// The registry's lock too, as joins take it; a member has its access from its making
	// (addLocked).
	g.mu.Lock()
	sf.mu.Lock()
	byCred := map[review.CredKey][]*member{}
	access := map[review.CredKey]*memberAccess{}
	var refused []*member
	for m := range sf.members {
		if m.access == nil {
			refused = append(refused, m) // never on a reviewed feed (join, handoffJoin); refused rather than guessed
			continue
		}
		byCred[m.access.ck] = append(byCred[m.access.ck], m)
		access[m.access.ck] = m.access
	}
	sf.mu.Unlock()
	g.mu.Unlock()

	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		sem = make(chan struct{}, absorbReviews)
	)
	for ck, a := range access {
		wg.Add(1)
		sem <- struct{}{}
		go func() { // ends with its review, bounded by the review's timeout and the feed's context
			defer func() { <-sem; wg.Done() }()
			if why := sf.h.reviewVerb(sf.f.ctx, a.req, &a.info, a.cred, a.ck, "list"); why != "" {
				mu.Lock()
				refused = append(refused, byCred[ck]...)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(refused) == 0 {
		return
	}
	sf.log.Info("subscribers of the shared feed may watch but were not allowed to list its scope; each gets the 410, the others the absorb",
		zap.Int("subscribers", len(refused)))
	st = goneStatus(st, sf.LastDelivered())
	for _, m := range refused {
		sf.relistMember(m, st)
		sf.h.deps.Metrics.GoneAbsorbed.WithLabelValues(absorb.ListDenied).Inc()
		sf.h.deps.Metrics.RelistsForced.Inc()
		sf.h.note("relist", nil, sf.f.client.URL.Path, "a subscriber may not list the scope the feed absorbed")
	}
}

// absorbReviews bounds the list reviews an absorb waits for at once.
const absorbReviews = 8

// relistMember ends the member m alone with the ERROR 410 st after what it has queued, as
// relist ends every member. The feed's goroutine.
func (sf *sharedFeed) relistMember(m *member, st *metav1.Status) {
	if sf.writer.WriteStatus(st) != nil {
		return
	}
	raw := sf.frame.take()
	sf.mu.Lock()
	defer sf.mu.Unlock()
	if _, ok := sf.members[m]; !ok {
		return // it left meanwhile
	}
	sf.drop(m)
	if m.push(raw, sf.h.clk.Now()) {
		m.finish(EndRelist)
	} // else it is over: it ends as a slow subscriber
}

// absorbBegin is called before an absorb's first event (absorbGone): until absorbEnd, no one
// joins the feed (a join at an RV in (R, L) would get the difference's ADDED and MODIFIED
// after it without its DELETED, which all carry R), and no waiting handoff is woken. The
// feed's goroutine.
func (sf *sharedFeed) absorbBegin() {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	sf.absorbing = true
}

// absorbEnd is called once every event of an absorb (its bookmark at the list's L last) was
// delivered: the ring starts over at L. Why that is sound (docs/design.md section 12, "Shared
// feeds", the ring across an absorb): a member that was subscribed got every synthesized event (a
// handoff's member still skipping got the DELETEDs at its own resourceVersion, fanOutGone),
// so it holds the list's state at L. A join at N in [R, L) would hold the true state at N, of
// which the difference says nothing (an object created after R and deleted before L is in
// neither the state nor the list), and the ring's events after N are not "the events after N"
// (the DELETEDs carry R, below N): so such a join must not be served from the ring, and is not
// once the ring covers from L only (privateNotCovered: a private feed, whose upstream answers
// it as the apiserver does). A join at L or after gets the ring's events after it, all real
// events delivered after L, as for any feed that started at L. The handoffs that waited are
// woken to judge again against the new ring. The feed's goroutine.
func (sf *sharedFeed) absorbEnd(L uint64) {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	sf.absorbing = false
	sf.restartRing(L)
	sf.wakeWaiters(true)
}

// fanOutGone appends an absorb's DELETED, rendered at the last delivered resourceVersion R in
// raw, to every member's queue: not to the ring (absorbEnd starts it over), and never skipped.
// A member a handoff joined ahead of the feed (member.skip, handoff.go) has a client whose
// snapshot at its own S >= R holds only objects the feed holds as they are, minus some deleted
// in (R, S] (every object of the snapshot is at most the feed's newest at the join, and the
// feed delivered every event up to it): the difference is then its difference too, and none of
// its ADDED or MODIFIED is at or below S (such an object would be in the snapshot above the
// feed's newest). Its DELETEDs are rendered at S instead of R, so that its resourceVersion never
// goes back; a delete of an object the snapshot lacks (deleted in (R, S]) is one of nothing,
// which a client ignores. mu is held.
func (sf *sharedFeed) fanOutGone(ev *stream.Event, raw []byte, R uint64) {
	now := sf.h.clk.Now()
	var at map[uint64][]byte // the frame rendered at each skipping member's resourceVersion
	for m := range sf.members {
		frame := raw
		if m.skip > R {
			if at == nil {
				at = map[uint64][]byte{}
			}
			if frame = at[m.skip]; frame == nil {
				if err := sf.writer.WriteWithRV(ev, strconv.FormatUint(m.skip, 10)); err != nil {
					sf.log.Warn("could not render an absorb's delete for a handed-off subscriber; its stream is ended, its client re-watches",
						zap.Error(err))
					sf.drop(m)
					m.finish(EndNoResume)
					continue
				}
				frame = sf.frame.take()
				at[m.skip] = frame
			}
		}
		sf.deliver(m, frame, now)
	}
}

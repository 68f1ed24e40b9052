package watch

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/review"
	"github.com/watchsan/watchsan/internal/upstream"
)

// The watch-list handoff (docs/design.md section 11). A watch-list
// (sendInitialEvents=true, client-go's default informers) that may share (shareRule said only
// "watch-list") starts on a private feed: its initial events are a snapshot no ring holds.
// Once its initial-events-end bookmark at B has been delivered (and flushed) to the client,
// the client is caught up at L = B, the private stream's last delivered resourceVersion, and
// what it needs from then on is exactly what a plain watch from L gets: every event with a
// resourceVersion above L, in order (section 2). The subscriber then moves onto the shared
// feed of that plain watch (the same key without sendInitialEvents and resourceVersionMatch):
// it joins it at L (the ring's events after L first), or joins a feed that has not yet
// delivered a resourceVersion up to L skipping what it delivers up to L (member.skip), or
// opens a new feed from L. Only once it is a member of a feed that answered does the
// private attempt end (the feed's pump ends it, endHandedOff); the client's stream, the same
// response, goes on with the member's frames. Whatever keeps it from moving, it stays
// private for its life, as without the handoff.
//
// A client with credentials of its own moves as any reviewed watch joins (package review): only once
// an access review sent at the bookmark allowed it to watch the scope (the apiserver authorized
// its watch-list when it began, which is older than the join), onto the feed of its own
// principal, or of every reviewed client for a group-version the apiserver serves itself
// (feedPrincipal), with its review's facts kept for an absorb's list review. That is what lets
// a tier of watchsans share the informers' watches of clients that forward their own tokens.

// The values of watchsan_shared_feed_handoffs_total's result label (HandoffResults).
const (
	// handoffJoined: onto the open shared feed of the same plain watch.
	handoffJoined = "joined"
	// handoffOpened: onto a shared feed it opened from its bookmark's resourceVersion.
	handoffOpened = "opened"
	// handoffBehind: the feed had not delivered the newest resourceVersion of the initial
	// events within handoffWait: it lags behind the private stream.
	handoffBehind = "behind"
	// handoffNotCovered: the feed's ring starts after the bookmark (it evicted events the
	// client has not got), or the feed ended meanwhile.
	handoffNotCovered = "not-covered"
	// handoffNotJoinable: the feed delivered resourceVersions out of order, or rewrote one, or
	// the private stream's own policy judged a regression: "the events after L" is then no
	// slice of either stream.
	handoffNotJoinable = "not-joinable"
	// handoffBacklog: the ring's events after the bookmark are more than a subscriber's bound.
	handoffBacklog = "backlog"
	// handoffFeedFailed: the feed's first answer was no stream, or in another format, or none
	// came within handoffWait.
	handoffFeedFailed = "feed-failed"
	// handoffEndedBefore: the client's stream ended before its initial-events-end bookmark
	// (the client left, its deadline, the upstream broke in the initial phase): as today.
	handoffEndedBefore = "ended-before"
	// handoffFeedLimit: no feed of the plain watch is open, and --share-max-feeds are.
	handoffFeedLimit = "feed-limit"
	// handoffDenied: the client has credentials of its own and the access review at its
	// bookmark did not allow it to watch the scope (or failed).
	handoffDenied = "denied"
)

// HandoffResults lists watchsan_shared_feed_handoffs_total's results (to initialise series).
var HandoffResults = []string{handoffJoined, handoffOpened, handoffBehind, handoffNotCovered,
	handoffNotJoinable, handoffBacklog, handoffFeedFailed, handoffEndedBefore, handoffFeedLimit, handoffDenied}

// handoffWait bounds how long a handoff waits, the private stream not read meanwhile, for the
// feed's first answer and for a feed behind the private stream to catch up; after it the
// watch stays private.
const handoffWait = 3 * time.Second

// handoff is a watch-list's move onto a shared feed, from its start on a private feed to its
// end there. The private feed's goroutine (its client's) is the only one that touches it.
type handoff struct {
	info reqinfo.Info // the watch's, for the feed it may open
	sub  *subscriber  // the private feed's
	// access is what the client's access review is made with when its credentials need one
	// (review.NeedsReview); nil for the lent identity, which asks no review.
	access *memberAccess
	// newest is the highest resourceVersion of an object event the private stream delivered:
	// a feed that has not delivered it yet is behind.
	newest uint64
	tried  bool // at the initial-events-end bookmark, once

	// Once moved: the feed and the member that serve the client.
	sf *sharedFeed
	m  *member
}

// handoffFor returns the handoff of the watch-list r, whose shareRule was only privateWatchList,
// or nil when it cannot hand off: it is no watch-list the apiserver takes
// (sendInitialEvents=true with resourceVersionMatch=NotOlderThan), its resourceVersion is no
// integer, or its timeoutSeconds is over.
func handoffFor(r *http.Request, info *reqinfo.Info, cred upstream.Credentials, p params) *handoff {
	if !p.sendInitialEvents || p.timeout < 0 || p.rvMatch != string(metav1.ResourceVersionMatchNotOlderThan) {
		return nil
	}
	if !p.rvIsInt && p.rv != "" && p.rv != "0" {
		return nil
	}
	ho := &handoff{info: *info}
	if review.NeedsReview(cred) {
		ho.access = newMemberAccess(r, info, cred, review.CredentialsKey(r, cred))
	}
	return ho
}

func (ho *handoff) count(h *Handler, result string) {
	h.deps.Metrics.SharedHandoffs.WithLabelValues(result).Inc()
}

// attach gives the handoff the private feed's subscriber sub, its client's response: what it
// flushes before it moves, and what the member's frames are written to after.
func (ho *handoff) attach(sub *subscriber) { ho.sub = sub }

// endedBefore counts a watch-list whose stream ended before its initial-events-end bookmark,
// or never began.
func (ho *handoff) endedBefore(h *Handler) { ho.count(h, handoffEndedBefore) }

// ended is the private stream's end, end, for its handoff: true when it moved onto a shared
// feed (endHandedOff) and its client has been served there till its stream ended (serve);
// false when the stream ended private, counted when its bookmark never came (a handoff
// tried was counted then).
func (ho *handoff) ended(f *feed, end EndReason) bool {
	if end == endHandedOff {
		ho.serve(f)
		return true
	}
	if !ho.tried {
		ho.endedBefore(f.h)
	}
	return false
}

// handedOff says whether the handoff ho moved its client onto a shared feed; false for none
// (nil).
func (ho *handoff) handedOff() bool { return ho != nil && ho.sf != nil }

// plainRequest is the watch-list r (its query as parsed: query; selects: its params.scope) as
// the plain watch from resourceVersion at that it is once its initial events are delivered:
// without sendInitialEvents and resourceVersionMatch, bookmarks as asked; and that watch's
// parameters. Its context is none of the client's (a feed it opens outlives the client).
func plainRequest(r *http.Request, query url.Values, selects string, at uint64, bookmarks bool) (*http.Request, params) {
	q := copyQuery(query)
	q.Del("sendInitialEvents")
	q.Del("resourceVersionMatch")
	rv := strconv.FormatUint(at, 10)
	q.Set("resourceVersion", rv)
	out := r.WithContext(context.Background())
	out.URL = &url.URL{Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: q.Encode()}
	return out, params{query: q, rv: rv, rvInt: at, rvIsInt: true, allowBookmarks: bookmarks, scope: selects}
}

// try moves the private feed f's client onto a shared feed, right after its initial-events-end
// bookmark was delivered: true when it is a member of a feed that answered (f's attempt ends
// then), false when it stays private (counted). It never holds a lock the feed's delivery
// takes while it waits.
func (ho *handoff) try(f *feed) bool {
	ho.tried = true
	h, sub := f.h, ho.sub
	if f.ctx.Err() != nil || (!f.deadline.IsZero() && !h.clk.Now().Before(f.deadline)) {
		ho.count(h, handoffEndedBefore)
		return false
	}
	// The private stream in order: no regression judged, and (for an exempt resource, whose
	// policy judges nothing) a bookmark not below an initial event.
	at, ok := f.resumePoint() // sub is f's sink
	if !ok || sub.regressed || ho.newest > at {
		return ho.stay(f, handoffNotJoinable, at)
	}
	// The client has everything up to the bookmark before anything of the feed's.
	if sub.flush() != nil {
		ho.count(h, handoffEndedBefore) // the feed's next read ends the stream with the error
		return false
	}
	if a := ho.access; a != nil {
		// A fresh review, as for every reviewed join; the private stream waits for it.
		switch why := h.reviewVerb(f.ctx, a.req, &a.info, a.cred, a.ck, "watch"); why {
		case "":
		case reviewClientGone:
			ho.count(h, handoffEndedBefore)
			return false
		default:
			return ho.stay(f, handoffDenied, at)
		}
	}
	sf, m := ho.feedFor(f, at)
	if sf == nil {
		return ho.stay(f, handoffFeedLimit, at)
	}
	timer := h.clk.NewTimer(handoffWait)
	defer timer.Stop()
	select {
	case <-sf.ready:
	case <-timer.C():
		if m != nil {
			sf.leave(m)
		}
		return ho.stay(f, handoffFeedFailed, at)
	case <-f.ctx.Done():
		if m != nil {
			sf.leave(m)
		}
		ho.count(h, handoffEndedBefore)
		return false
	}
	if !sf.ok || sf.f.format != f.format {
		if m != nil {
			sf.leave(m) // a no-op if it ended
		}
		return ho.stay(f, handoffFeedFailed, at)
	}
	if m != nil {
		return ho.moved(f, sf, m, handoffOpened, at)
	}
	for {
		m, result, wait := sf.handoffJoin(at, ho.newest, sub.allowBookmarks, ho.access)
		switch {
		case m != nil:
			return ho.moved(f, sf, m, handoffJoined, at)
		case wait == nil:
			return ho.stay(f, result, at)
		}
		select {
		case <-wait:
		case <-timer.C():
			sf.unwait(wait)
			return ho.stay(f, handoffBehind, at)
		case <-f.ctx.Done():
			sf.unwait(wait)
			ho.count(h, handoffEndedBefore)
			return false
		}
	}
}

// feedFor returns the open feed of the plain watch from at, or opens it from at with m its
// first member; nil when none is open and --share-max-feeds are.
func (ho *handoff) feedFor(f *feed, at uint64) (*sharedFeed, *member) {
	h := f.h
	r, p := plainRequest(f.client, f.query, f.scope, at, ho.sub.allowBookmarks)
	// The lent identity's feeds are "lent"; a reviewed client's its principal's, or every
	// reviewed client's where the apiserver serves the group-version itself.
	key := feedKey(r, p.query, f.cred, ho.access != nil && h.servedLocally(&ho.info))
	g := h.feeds
	g.mu.Lock()
	defer g.mu.Unlock()
	if sf := g.feeds[key]; sf != nil {
		return sf, nil
	}
	if len(g.feeds) >= h.cfg.ShareMaxFeeds {
		return nil, nil
	}
	// The private feed's state, complete at at, goes with it (share_state.go).
	st, why := handoffState(f)
	return h.openFeed(key, r, p, &ho.info, f.cred, ho.access, st, why)
}

func (ho *handoff) moved(f *feed, sf *sharedFeed, m *member, result string, at uint64) bool {
	ho.sf, ho.m = sf, m
	ho.count(f.h, result)
	if ce := f.log.Check(zap.DebugLevel, "watch-list handed off onto a shared feed"); ce != nil {
		ce.Write(zap.String("path", f.client.URL.Path), zap.String("result", result), zap.Uint64("rv", at))
	}
	return true
}

func (ho *handoff) stay(f *feed, result string, at uint64) bool {
	ho.count(f.h, result)
	f.log.Info("watch-list stays on its own upstream watch after its initial events", zap.String("path", f.client.URL.Path),
		zap.String("why", result), zap.Uint64("rv", at), zap.Uint64("newest", ho.newest))
	return false
}

// serve answers the client from the member it handed off to, on the same response, until its
// stream ends, as a shared feed's subscriber (sharedFeed.serve) with the private feed's
// deadline. The private feed is released first: its attempt ended already.
func (ho *handoff) serve(f *feed) {
	h, sf, m := f.h, ho.sf, ho.m
	f.release()
	defer sf.leave(m)
	var deadline <-chan struct{}
	if !f.deadline.IsZero() {
		dl := make(chan struct{})
		t := h.clk.AfterFunc(f.deadline.Sub(h.clk.Now()), func() { close(dl) })
		defer t.Stop()
		deadline = dl
	}
	end := sf.pump(f.client, m, &ho.sub.out, deadline, f.deadlineEnd(), nil)
	h.deps.Metrics.StreamEnds.WithLabelValues(end.String()).Inc()
	if end == EndSlowClient {
		h.deps.Metrics.SharedSlowSubscribers.Inc()
	}
	if ce := f.log.Check(zap.DebugLevel, "watch ended"); ce != nil {
		ce.Write(zap.String("path", f.client.URL.Path), zap.Stringer("reason", end), zap.Bool("handedOff", true))
	}
}

// rvWaiter is a handoff waiting for its feed to deliver rv: ch is closed then, or when the feed
// ends or no one may join it any more.
type rvWaiter struct {
	rv uint64
	ch chan struct{}
}

// handoffJoin makes a member for a watch-list whose client has everything up to at, and has
// been sent object events up to newest: at at when the feed delivered at already (the ring's
// events after it queued); else, when the feed delivered newest, at the feed's newest with
// member.skip at: the feed will deliver every event after its newest, and those up to at the
// client's initial events hold. Else it says why not, and when the feed is only behind, what
// to wait on (the caller unwaits it if it gives up).
// acc is what the member's access review was made with (nil: the lent identity's).
func (sf *sharedFeed) handoffJoin(at, newest uint64, bookmarks bool, acc *memberAccess) (*member, string, chan struct{}) {
	g := sf.h.feeds
	g.mu.Lock()
	defer g.mu.Unlock()
	sf.mu.Lock()
	defer sf.mu.Unlock()
	switch {
	case sf.closed:
		return nil, handoffNotCovered, nil
	case sf.notJoinable != "" || sf.rewrote:
		return nil, handoffNotJoinable, nil
	case !sf.absorbing && !sf.ring.Covers(at):
		return nil, handoffNotCovered, nil
	case newest > sf.last || sf.absorbing: // an absorb's end wakes it to judge again (share_state.go)
		ch := make(chan struct{})
		sf.waiters = append(sf.waiters, rvWaiter{rv: newest, ch: ch})
		return nil, handoffBehind, ch
	}
	m, reason := sf.addLocked(min(at, sf.last), bookmarks, acc)
	switch reason {
	case "":
	case privateBacklog:
		return nil, handoffBacklog, nil
	case privateNotCovered:
		return nil, handoffNotCovered, nil
	default:
		return nil, handoffNotJoinable, nil
	}
	if at > sf.last {
		m.skip = at
	}
	sf.h.deps.Metrics.SharedJoins.Inc()
	return m, "", nil
}

// wakeWaiters closes the waiters whose resourceVersion the feed delivered, or all. mu is held.
func (sf *sharedFeed) wakeWaiters(all bool) {
	kept := sf.waiters[:0]
	for _, w := range sf.waiters {
		if all || w.rv <= sf.last {
			close(w.ch)
			continue
		}
		kept = append(kept, w)
	}
	clear(sf.waiters[len(kept):])
	sf.waiters = kept
}

// unwait forgets the waiter ch, if it still waits.
func (sf *sharedFeed) unwait(ch chan struct{}) {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	for i, w := range sf.waiters {
		if w.ch == ch {
			sf.waiters = append(sf.waiters[:i], sf.waiters[i+1:]...)
			return
		}
	}
}

// skips says whether the member m, joined by a handoff ahead of the feed, skips the frame
// delivered at rv (0: no resourceVersion): its client's initial events hold everything up to
// m.skip. The first frame above it (or without one, an ERROR) ends the skipping. A frame the
// policy rewrote at or below it ends the member: a rewritten resourceVersion says nothing of
// the event's true one, which may be above m.skip, so its client re-watches from its last
// resourceVersion instead (EndNoResume: ended cleanly). mu is held.
func (sf *sharedFeed) skips(m *member, rv uint64, rewritten bool) bool {
	switch {
	case rv == 0 || rv > m.skip:
		m.skip = 0
		return false
	case rewritten:
		sf.log.Info("a rewritten event came before the resourceVersion a handed-off watch-list joined at; its stream is ended, its client re-watches",
			zap.Uint64("rv", rv), zap.Uint64("joinedAt", m.skip))
		sf.drop(m)
		m.finish(EndNoResume)
	}
	return true
}

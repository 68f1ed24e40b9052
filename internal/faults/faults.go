package faults

import (
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/watchsan/watchsan/internal/stream"
)

// Faults is the set of misbehaviours a Layer injects into the watches passing through it. The
// zero value injects nothing. Counts are per watch response unless said otherwise.
type Faults struct {
	// DeleteOldRV reproduces the Kubernetes 1.7.0-1.9.2 watch-cache bug (docs/design.md
	// section 1a): every DELETED event carries the deleted object's previous resourceVersion,
	// the one of its last create or update, instead of the delete's revision. Only the
	// resourceVersion changes; the rest of the frame stays as the apiserver sent it, in every
	// format. When the previous resourceVersion is unknown to the layer it is asked of the
	// apiserver (see Layer); when that fails too the event passes unchanged and
	// Stats.DeletesUnknown counts it.
	DeleteOldRV bool

	// EndWatchAfterDelete ends the watch response cleanly right after it delivered a DELETED
	// event: what a reflector's periodic re-watch would do, only now. It fires once per deleted
	// object per Layer: the replay a client then gets (the same delete again, when DeleteOldRV
	// sent it back in time) runs through, as the next periodic re-watch would come minutes
	// later. Ending after every replayed delete would loop a client forever, which no real
	// system did. Use one Layer per client when each must see its own end.
	EndWatchAfterDelete bool

	// ResetEveryN aborts a watch response right after its Nth event (every watch through the
	// layer gets N events, then breaks): over HTTP/1.1 the connection closes with the chunked
	// body unfinished, over HTTP/2 the stream gets RST_STREAM. Either way the client reads an
	// error, not a clean end. Zero: off.
	ResetEveryN int

	// ResetTCP makes ResetEveryN reset the TCP connection itself (SO_LINGER 0, the peer reads
	// ECONNRESET), after the bytes written so far have left the send queue. Over HTTP/1.1 the
	// layer hijacks the connection; over HTTP/2 it needs the server's ConnContext set to this
	// package's ConnContext and then kills every stream on that connection, as a dead
	// apiserver does (the last frames may be lost there, as on a real network). Where neither
	// works it falls back to ResetEveryN's abort and logs a warning. Requires ResetEveryN.
	ResetTCP bool

	// Fail503FirstK answers the first K watch requests after Set with 503, Retry-After: 1 and
	// the metav1.Status an apiserver that is shutting down sends. Later ones pass. Zero: off.
	Fail503FirstK int

	// StallAfterN stops a watch response after its Nth event: nothing more is sent (the
	// upstream watch is cancelled) but the response is held open until the client goes away,
	// as a hung apiserver or a dead proxy hop would. Zero: off.
	StallAfterN int

	// GoAway answers every watch with a GOAWAY on its HTTP/2 connection, sent with the response
	// headers: the response carries "Connection: close", which Go's HTTP/2 server turns into a
	// graceful GOAWAY (the apiserver's --goaway-chance filter uses the same header). The watch
	// itself goes on; the client must open its next streams on a new connection. Combine with
	// ResetEveryN or EndWatchAfterDelete to also cut the stream. Over HTTP/1.1 the connection
	// is closed after the response instead.
	GoAway bool

	// EndImmediately ends watches cleanly at once: a new watch right after its response
	// headers, before any event (the client reads 200 and an empty stream), a running one
	// right after its next event. What an apiserver or a proxy hop that closes its watches
	// looks like to a client, over and over while it lasts.
	EndImmediately bool

	// EndIdleAfter ends a watch response cleanly once it has written nothing (no event, no
	// bookmark) for this long, as an L7 gateway's stream idle timeout does (Envoy's is 5
	// minutes by default; docs/design.md section 1b). The clock starts when the response
	// header is sent and restarts with every event written; the setting active then is the one
	// that counts for that response. Zero: off.
	EndIdleAfter time.Duration

	// DropBookmarks drops every BOOKMARK event, the initial-events-end bookmark included, as a
	// proxy that does not know them does: the client never hears of progress on a quiet watch,
	// and a watch-list informer never syncs (docs/design.md section 2).
	DropBookmarks bool

	// HoldListAnswers holds the answer of every list (a GET of a collection, not a watch): the
	// apiserver is asked at once, so its read happens when the request arrives, and the
	// answer, kept whole, reaches the client only once the gate is open (or the client
	// left). A read that stays in flight while the test writes: what it answers is older than
	// the write. Stats.ListsHeld counts the answers held. Nil: off.
	HoldListAnswers *Gate
}

// Validate reports every problem with f at once, or nil.
func (f Faults) Validate() error {
	var errs []error
	nonNegative := func(name string, v int) {
		if v < 0 {
			errs = append(errs, fmt.Errorf("faults: %s must be zero (off) or positive, got %d", name, v))
		}
	}
	nonNegative("ResetEveryN", f.ResetEveryN)
	nonNegative("Fail503FirstK", f.Fail503FirstK)
	nonNegative("StallAfterN", f.StallAfterN)
	if f.EndIdleAfter < 0 {
		errs = append(errs, fmt.Errorf("faults: EndIdleAfter must be zero (off) or positive, got %v", f.EndIdleAfter))
	}
	if f.ResetTCP && f.ResetEveryN <= 0 {
		errs = append(errs, errors.New("faults: ResetTCP needs ResetEveryN > 0 (it only changes how that reset is done)"))
	}
	return errors.Join(errs...)
}

// active is one Set's faults plus the counters that belong to that setting (a new Set starts
// them again).
type active struct {
	Faults
	// admitted counts the watch requests seen since Set, for Fail503FirstK.
	admitted atomic.Int64
}

// verdict is what a watch does after an event was written.
type verdict int

const (
	carryOn verdict = iota
	endClean
	reset
	stall
)

// A fault is one misbehaviour, as hooks at the points of a watch's life where it acts. A nil
// hook does nothing. To add a fault: a field in Faults (and its check in Validate), a counter
// in Stats, and one entry in faultList, in a file of its own.
type fault struct {
	name string
	// admit runs before the watch goes upstream; it returns true when it answered the
	// request itself.
	admit func(a *active, wt *watchReq) bool
	// header runs on the client's response header before it is written.
	header func(a *active, wt *watchReq, h http.Header)
	// started runs once the response header was sent, before the first event; the first
	// verdict other than carryOn ends the watch (only endClean is supported there).
	started func(a *active, wt *watchReq) verdict
	// drop returns true to leave ev out of the response; the after hooks do not run for it.
	drop func(a *active, wt *watchReq, ev *stream.Event) bool
	// rv returns the resourceVersion to write ev with, or "" to leave it as it is. The first
	// fault that returns one wins.
	rv func(a *active, wt *watchReq, ev *stream.Event) string
	// after runs once ev has been written and flushed; the first verdict other than carryOn
	// ends the loop.
	after func(a *active, wt *watchReq, ev *stream.Event) verdict
}

// faultList holds every fault in the order its hooks run.
var faultList = []fault{
	fail503Fault,
	goAwayFault,
	deleteOldRVFault,
	endAfterDeleteFault,
	endImmediatelyFault,
	resetFault,
	stallFault,
	dropBookmarksFault,
}

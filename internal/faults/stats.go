package faults

import "sync/atomic"

// Stats counts what the layer did, so tests can assert that a fault really fired.
type Stats struct {
	// Requests is the number of requests the layer saw, watches and everything else (the
	// load the clients behind it put on the upstream).
	Requests int64
	// Watches is the number of watch requests the layer saw.
	Watches int64
	// Refused503 counts watch requests answered with 503 (Fail503FirstK).
	Refused503 int64
	// GoAways counts watch responses sent with a GOAWAY (GoAway).
	GoAways int64
	// DeletesRewritten counts DELETED events sent with their previous resourceVersion.
	DeletesRewritten int64
	// DeletesUnknown counts DELETED events passed unchanged under DeleteOldRV because their
	// previous resourceVersion could not be found.
	DeletesUnknown int64
	// Lookups counts the fallback LISTs sent for a previous resourceVersion, LookupsFailed
	// those that did not give one.
	Lookups, LookupsFailed int64
	// EndedAfterDelete counts watches ended right after a DELETED event.
	EndedAfterDelete int64
	// Resets counts watch responses aborted or reset (ResetEveryN).
	Resets int64
	// Stalls counts watch responses stalled (StallAfterN).
	Stalls int64
	// EndedImmediately counts watch responses ended at once (EndImmediately).
	EndedImmediately int64
	// EndedIdle counts watch responses ended after writing nothing for EndIdleAfter.
	EndedIdle int64
	// BookmarksDropped counts BOOKMARK events left out (DropBookmarks).
	BookmarksDropped int64
	// UpstreamGarbage counts watch responses ended because the upstream stream was unreadable
	// (malformed, truncated or oversized frames).
	UpstreamGarbage int64
	// ListsHeld counts list answers held (HoldListAnswers).
	ListsHeld int64
}

type counters struct {
	requests, endedImmediately                                     atomic.Int64
	watches, refused503, goAways, deletesRewritten, deletesUnknown atomic.Int64
	lookups, lookupsFailed, endedAfterDelete, resets, stalls       atomic.Int64
	garbage, endedIdle, bookmarksDropped, listsHeld                atomic.Int64
}

// Stats returns the layer's counts since New.
func (l *Layer) Stats() Stats {
	c := &l.stats
	return Stats{
		Requests:         c.requests.Load(),
		Watches:          c.watches.Load(),
		Refused503:       c.refused503.Load(),
		GoAways:          c.goAways.Load(),
		DeletesRewritten: c.deletesRewritten.Load(),
		DeletesUnknown:   c.deletesUnknown.Load(),
		Lookups:          c.lookups.Load(),
		LookupsFailed:    c.lookupsFailed.Load(),
		EndedAfterDelete: c.endedAfterDelete.Load(),
		Resets:           c.resets.Load(),
		Stalls:           c.stalls.Load(),
		EndedImmediately: c.endedImmediately.Load(),
		EndedIdle:        c.endedIdle.Load(),
		BookmarksDropped: c.bookmarksDropped.Load(),
		ListsHeld:        c.listsHeld.Load(),
		UpstreamGarbage:  c.garbage.Load(),
	}
}

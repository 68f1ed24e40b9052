package faults

import (
	"go.uber.org/zap"

	"github.com/watchsan/watchsan/internal/stream"
)

// endImmediatelyFault ends watches cleanly at once (EndImmediately): a new one before its
// first event, a running one after its next.
var endImmediatelyFault = fault{
	name: "end-immediately",
	started: func(a *active, wt *watchReq) verdict {
		if !a.EndImmediately {
			return carryOn
		}
		wt.l.stats.endedImmediately.Add(1)
		wt.log.Debug("ending the watch before its first event (EndImmediately)")
		return endClean
	},
	after: func(a *active, wt *watchReq, _ *stream.Event) verdict {
		if !a.EndImmediately {
			return carryOn
		}
		wt.l.stats.endedImmediately.Add(1)
		wt.log.Debug("ending the running watch (EndImmediately)", zap.Int("events", wt.events))
		return endClean
	},
}

package faults

import (
	"go.uber.org/zap"

	"github.com/watchsan/watchsan/internal/stream"
)

// stallFault stops a watch after StallAfterN events and holds it open until the client goes
// away.
var stallFault = fault{
	name: "stall",
	after: func(a *active, wt *watchReq, ev *stream.Event) verdict {
		if a.StallAfterN <= 0 || wt.events < a.StallAfterN {
			return carryOn
		}
		wt.l.stats.stalls.Add(1)
		wt.log.Info("stalling the watch (StallAfterN)", zap.Int("events", wt.events))
		return stall
	},
}

package faults

import (
	"go.uber.org/zap"

	"github.com/watchsan/watchsan/internal/stream"
)

// endAfterDeleteFault ends a watch cleanly right after a DELETED event, once per deleted
// object (EndWatchAfterDelete).
var endAfterDeleteFault = fault{
	name: "end-after-delete",
	after: func(a *active, wt *watchReq, ev *stream.Event) verdict {
		if !a.EndWatchAfterDelete || ev.Type != stream.Deleted || !wt.l.tracker.firstEnd(ev) {
			return carryOn
		}
		wt.l.stats.endedAfterDelete.Add(1)
		wt.log.Info("ending the watch after a delete (EndWatchAfterDelete)",
			zap.String("namespace", ev.Namespace), zap.String("name", ev.Name), zap.String("rv", ev.RV))
		return endClean
	},
}

package faults

import (
	"go.uber.org/zap"

	"github.com/watchsan/watchsan/internal/stream"
)

// dropBookmarksFault leaves every BOOKMARK event out of the response (DropBookmarks).
var dropBookmarksFault = fault{
	name: "drop-bookmarks",
	drop: func(a *active, wt *watchReq, ev *stream.Event) bool {
		if !a.DropBookmarks || ev.Type != stream.Bookmark {
			return false
		}
		wt.l.stats.bookmarksDropped.Add(1)
		wt.log.Debug("dropping a bookmark (DropBookmarks)", zap.String("rv", ev.RV), zap.Bool("initialEventsEnd", ev.InitialEventsEnd))
		return true
	},
}

// dropped reports whether a fault leaves ev out of the response.
func dropped(a *active, wt *watchReq, ev *stream.Event) bool {
	for _, f := range faultList {
		if f.drop != nil && f.drop(a, wt, ev) {
			return true
		}
	}
	return false
}

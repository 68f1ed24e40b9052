package faults

import (
	"errors"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// errIdleCut ends the layer's read of the upstream when EndIdleAfter fired.
var errIdleCut = errors.New("faults: watch idle for EndIdleAfter; cut")

// idleCut ends one watch response that wrote nothing for EndIdleAfter (the setting active
// when the response started): it cancels the upstream watch and closes the upstream end of the
// pipe, so the event loop's read fails with errIdleCut and the response ends cleanly. A nil
// *idleCut (the fault is off) does nothing.
type idleCut struct {
	t     *time.Timer
	after time.Duration
	fired atomic.Bool
}

func startIdleCut(a *active, wt *watchReq, u *upstream) *idleCut {
	if a.EndIdleAfter <= 0 {
		return nil
	}
	c := &idleCut{after: a.EndIdleAfter}
	c.t = time.AfterFunc(c.after, func() {
		if !c.fired.CompareAndSwap(false, true) {
			return
		}
		wt.l.stats.endedIdle.Add(1)
		wt.log.Info("ending an idle watch (EndIdleAfter)", zap.Duration("idle", c.after), zap.Int("events", wt.events))
		// The pipe first: a pipe keeps its first error, and cancelling the upstream first let
		// the copy into the pipe close it with the upstream's abort, which the loop passed on
		// to the client as a broken stream (CI, TestEndIdleAfter/json).
		u.pw.CloseWithError(errIdleCut) // the writer side: the loop's read returns errIdleCut
		u.cancel()
	})
	return c
}

// touch restarts the idle clock after an event was written.
func (c *idleCut) touch() {
	if c != nil && !c.fired.Load() {
		c.t.Reset(c.after)
	}
}

// stop ends the clock when the response ends for another reason.
func (c *idleCut) stop() {
	if c != nil {
		c.t.Stop()
	}
}

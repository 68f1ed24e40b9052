package upstream

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// stepClock is a fake clock (PoolOptions.Clock) that tells which of its timers are pending:
// registered, neither fired nor stopped, by the duration they were made with. The pool's
// timers have distinct durations in a test (the health interval, half a ping timeout, a ping
// timeout, a probe timeout), so a test can wait until the pool waits where it expects before
// it steps the clock: a live backend's answer then never races a timeout, however loaded the
// machine, and a frozen one's detection is counted in steps, not in wall time.
type stepClock struct {
	*clocktesting.FakeClock
	mu  sync.Mutex
	set map[*stepTimer]struct{}
}

type stepTimer struct {
	clock.Timer
	c      *stepClock
	d      time.Duration
	target time.Time
}

func newStepClock() *stepClock {
	return &stepClock{FakeClock: clocktesting.NewFakeClock(time.Unix(1_000_000, 0)), set: map[*stepTimer]struct{}{}}
}

func (c *stepClock) track(t *stepTimer) *stepTimer {
	c.mu.Lock()
	c.set[t] = struct{}{}
	c.mu.Unlock()
	return t
}

func (c *stepClock) NewTimer(d time.Duration) clock.Timer {
	now := c.Now()
	return c.track(&stepTimer{Timer: c.FakeClock.NewTimer(d), c: c, d: d, target: now.Add(d)})
}

func (c *stepClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	now := c.Now()
	return c.track(&stepTimer{Timer: c.FakeClock.AfterFunc(d, f), c: c, d: d, target: now.Add(d)})
}

func (c *stepClock) After(d time.Duration) <-chan time.Time {
	now := c.Now()
	c.track(&stepTimer{c: c, d: d, target: now.Add(d)}) // never stopped: pending until its time
	return c.FakeClock.After(d)
}

// waiting reports whether the health loop waits for its next round: a timer pending whose
// duration is none of busy (the timeouts and halves of a round in progress).
func (c *stepClock) waiting(busy ...time.Duration) bool {
	now := c.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
next:
	for t := range c.set {
		if !t.target.After(now) {
			continue
		}
		for _, d := range busy {
			if t.d == d {
				continue next
			}
		}
		return true
	}
	return false
}

func (t *stepTimer) Stop() bool {
	t.c.mu.Lock()
	delete(t.c.set, t)
	t.c.mu.Unlock()
	return t.Timer.Stop()
}

// pending counts the timers made with d that have neither fired nor been stopped.
func (c *stepClock) pending(d time.Duration) int {
	now := c.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for t := range c.set {
		if t.d == d && t.target.After(now) {
			n++
		}
	}
	return n
}

// await waits (wall time, generously: nothing here needs the machine to be fast) until cond.
func (c *stepClock) await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; pending timers: %v", what, c.pendingList())
		}
		time.Sleep(time.Millisecond)
	}
}

// pendingList lists the durations of the pending timers (for a failure's message).
func (c *stepClock) pendingList() []string {
	now := c.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for t := range c.set {
		if t.target.After(now) {
			out = append(out, fmt.Sprintf("%v made %v ago", t.d, now.Sub(t.target.Add(-t.d))))
		}
	}
	return out
}

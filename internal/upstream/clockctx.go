package upstream

import (
	"context"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// withTimeout is context.WithTimeout on clk (the pool's, PoolOptions.Clock): the context ends
// with context.DeadlineExceeded once d has passed on clk, so that a ping's or a probe's
// timeout is stepped with the rest of the pool in tests, and reads as before everywhere else
// (a dial cut by it says "i/o timeout", a request "context deadline exceeded"; cause.go
// classifies both as timeouts). cancel must be called, as context.WithTimeout's.
func withTimeout(parent context.Context, clk clock.WithDelayedExecution, d time.Duration) (context.Context, context.CancelFunc) {
	c := &timeoutCtx{Context: context.WithoutCancel(parent), done: make(chan struct{})}
	stopParent := context.AfterFunc(parent, func() { c.end(parent.Err()) })
	t := clk.AfterFunc(d, func() { c.end(context.DeadlineExceeded) })
	return c, func() {
		t.Stop()
		stopParent()
		c.end(context.Canceled)
	}
}

// timeoutCtx is withTimeout's context: its parent's values, its own Done and Err. It hides its
// parent's cancellation from context.Cause and from contexts derived from it (WithoutCancel),
// so both take its Err, DeadlineExceeded when the time is up, as with context.WithTimeout.
type timeoutCtx struct {
	context.Context
	done chan struct{}

	mu  sync.Mutex
	err error // set once, by end
}

func (c *timeoutCtx) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
		close(c.done)
	}
}

func (c *timeoutCtx) Done() <-chan struct{} { return c.done }

func (c *timeoutCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

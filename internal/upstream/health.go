package upstream

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// How a backend is judged (found in seconds, without false alarms). Two questions,
// asked every HealthInterval:
//   - Does the process answer at all? An HTTP/2 PING on a connection of the health checker's
//     own (ping.go), answered by the server's connection reader: a frozen (SIGSTOP) or dead
//     apiserver does not answer within PingTimeout; a slow one (etcd slow, CPU starved by a
//     handler) still does. A ping not answered within half of PingTimeout is tried on a fresh
//     connection too, each connection given the whole PingTimeout (Pool.ping, section 10.9),
//     before the verdict, and anything else that came from the backend meanwhile (an event, a
//     response) counts as an answer: a loaded machine does not make a live backend dead.
//   - Is it ready? Its /readyz, bounded by ProbeTimeout, one at a time and off the ping's
//     path, so a /readyz waiting on etcd never delays the next ping; on connections of the
//     health checker's own, with the probe identity, else the kubeconfig's, else none. A 401 or
//     403 is no proof of readiness (docs/design.md section 10.6): with an identity, or when an
//     anonymous probe of this pool has passed before, it means not ready (a restarting
//     apiserver answers so until its authorizer has synced); an anonymous probe answered so
//     by a cluster that never let one pass proves only that the backend is alive, and the
//     backend counts as ready without proof (ReadinessUnverified).
//
// A backend that answers pings is healthy when ready, degraded when /readyz fails or is slow;
// one that does not, or refuses connections, is unhealthy. A backend that cannot be pinged
// (plain http://, or no HTTP/2) is judged by /readyz alone, as before: no answer is unhealthy.
// Traffic adds signals: a refused dial is a verdict at once (refused); a reset, a lost
// connection or a silent watch asks for a check at once (ReportFailure); watches behind their
// peers on other backends mark it lagging (outlier.go, which this file tells of recoveries).
//
// This file owns a backend's health (healthState): every field of it is written here, and a
// backend's state changes only through judge, the one function from the last signals
// (liveness, readiness) to a state, and the membership's removal and revival (pool.go calls
// removeLocked and reviveLocked). Every time is on the pool's clock (PoolOptions.Clock).

// healthState is a backend's health. Written by health.go alone; the zero value is a
// backend nothing was heard of: Unknown, never alive, never probed.
type healthState struct {
	state atomic.Int32 // its State; changed by transitionLocked alone
	// healthyAt is the last time it was known healthy (Unix ns); 0: never.
	healthyAt atomic.Int64
	// aliveAt is the last time anything came from it (a ping's ACK, an answer, an event;
	// Unix ns); 0: never.
	aliveAt atomic.Int64
	// kickedAt is the last early re-check asked for (Unix ns); 0: none.
	kickedAt atomic.Int64
	// probeStatus is the last /readyz probe's HTTP status, to log a 401 or 403 once; 0: none.
	probeStatus atomic.Int32
	// liveness is the last ping verdict (or a refused dial's), readiness the last /readyz
	// verdict; zero: unknown.
	liveness  atomic.Int32
	readiness atomic.Int32
	// readyErr is why the last /readyz did not pass (nil: it passed, or none yet), written by
	// probe alone, before readiness: a signal with no error of its own (a ping that passed)
	// is judged with it, so that it does not replace the probe's cause with a vaguer one.
	readyErr atomic.Pointer[readyError]
	// deadAt is when the signal that last found it dead began (the ping's round, the refused
	// dial; Unix ns): only an answer to a probe sent since proves it back (probe); 0: never.
	deadAt atomic.Int64
	// readyBusy: a /readyz probe is in flight.
	readyBusy atomic.Bool
	// probedAt is when the last /readyz probe started (Unix ns); 0: due now.
	probedAt atomic.Int64
	// pingFailed: a ping failed since the last one that passed.
	pingFailed atomic.Bool
	// noH2: it answered without HTTP/2, so it is judged by /readyz alone; false: pinged when
	// it has a pinger (https).
	noH2 atomic.Bool
	// record is what the checker last found, its cause included (cause.go), written by
	// verdict alone; zero: nothing judged yet.
	record healthRecord
}

// readyError is a /readyz probe's error (nil: it passed), as healthState.readyErr holds it.
type readyError struct{ err error }

// pingable says whether b is pinged: https, and not found without HTTP/2.
func (b *Backend) pingable() bool { return b.ping != nil && !b.hc.noH2.Load() }

// alive records a sign of life: anything that came from it.
func (b *Backend) alive() { b.hc.aliveAt.Store(b.pool.clk.Now().UnixNano()) }

// refused takes a failed dial of real traffic as a verdict, through judge as any other, and
// asks for one early re-check at most per health interval.
func (b *Backend) refused(err error) {
	p := b.pool
	b.hc.deadAt.Store(p.clk.Now().UnixNano())
	b.hc.liveness.Store(livenessDead)
	p.judge(b, err)
	p.recheck(b)
}

// suspect takes a 5xx or 429 answer from real traffic as a reason to check b now, /readyz
// included: a proxy in front of an apiserver (Envoy, an L7 balancer) answers pings itself, so
// only /readyz and traffic show that the apiserver behind it is gone.
func (p *Pool) suspect(b *Backend) {
	b.hc.probedAt.Store(0)
	p.recheck(b)
}

// recheck asks b's health loop for an early check, at most once per health interval.
func (p *Pool) recheck(b *Backend) {
	now := p.clk.Now().UnixNano()
	last := b.hc.kickedAt.Load()
	if now-last < int64(p.opts.HealthInterval) || !b.hc.kickedAt.CompareAndSwap(last, now) {
		return
	}
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// ReportFailure tells the pool that traffic on b failed in a way that may mean b is in
// trouble (a connection reset or lost, a watch that went silent): b is checked at once,
// rather than at its next interval. It judges nothing by itself: the check does.
func (b *Backend) ReportFailure(err error) {
	if err != nil {
		b.pool.recheck(b)
	}
}

// healthySince returns the last time any backend was known healthy (zero: never).
func (p *Pool) healthySince() time.Time {
	var last int64
	for _, b := range p.Backends() {
		last = max(last, b.hc.healthyAt.Load())
	}
	if last == 0 {
		return time.Time{}
	}
	return time.Unix(0, last)
}

const (
	livenessUnknown int32 = iota
	livenessAlive
	livenessDead
)

const (
	readyUnknown int32 = iota
	readyOK
	readyNotReady
	readyNoAnswer
	// readyUnverified: /readyz answered 401 or 403 to an anonymous probe where no anonymous
	// probe has passed: alive, ready unknown; taken as ready (there is nothing better to know).
	readyUnverified
)

// setState records a verdict (verdict calls it). A transition is logged once, told to
// OnState, wakes whoever waits for a usable backend and the mover (Pool.notifyLocked). This is
// the only place a backend's state changes; a removed backend's state changes only when it is
// added again (reviveLocked).
func (p *Pool) setState(b *Backend, s State, cause error) { p.transition(b, s, cause, false) }

// removeLocked makes b Removed (SetUpstreams, p.mu held).
func (p *Pool) removeLocked(b *Backend) { p.transitionLocked(b, Removed, nil, false) }

// reviveLocked makes a removed b Unknown again, and asks for its check now (SetUpstreams, p.mu
// held).
func (p *Pool) reviveLocked(b *Backend) {
	p.transitionLocked(b, Unknown, nil, true)
	p.recheck(b)
}

func (p *Pool) transition(b *Backend, s State, cause error, revive bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.transitionLocked(b, s, cause, revive)
}

// transitionLocked is transition with p.mu held.
func (p *Pool) transitionLocked(b *Backend, s State, cause error, revive bool) {
	now := p.clk.Now()
	old := State(b.hc.state.Load())
	if old == Removed && s != Removed && !revive {
		return
	}
	b.hc.state.Store(int32(s))
	if s == Healthy || old == Healthy {
		b.hc.healthyAt.Store(now.UnixNano()) // healthy until now
	}
	if old == s {
		return
	}
	var kind zap.Field = zap.Skip()
	if c, ok := cause.(*Cause); ok {
		kind = zap.String("cause", string(c.Kind))
	}
	switch s {
	case Healthy:
		if old == Degraded || old == Unhealthy {
			p.forgiveLag(b, false) // its lag came with the trouble it recovered from
		}
		var after zap.Field = zap.Skip()
		if h := b.hc.record.snap.Load(); h != nil && h.LastError != nil && old != Unknown {
			after = zap.String("after", h.LastError.Error()) // what it was not healthy for
		}
		p.log.Info("upstream healthy", zap.Stringer("upstream", b), zap.Stringer("was", old), after)
	case Degraded:
		p.log.Warn("upstream degraded: it answers, but not ready; used only while no healthy upstream is left, its watches move",
			zap.Stringer("upstream", b), zap.Stringer("was", old), kind, zap.Error(cause))
	case Unknown:
		p.log.Info("upstream added again", zap.Stringer("upstream", b))
	case Removed:
		p.log.Info("upstream removed; its watches move", zap.Stringer("upstream", b), zap.Stringer("was", old),
			zap.Int64("watches", b.OpenWatches()))
	default:
		var silent time.Duration
		if at := b.hc.aliveAt.Load(); at > 0 {
			silent = now.Sub(time.Unix(0, at))
		}
		// Nothing waits on it (section 10.8): requests still waiting for its answer are cut,
		// to be retried elsewhere or answered 503.
		cut := b.waiting.cutAll()
		p.log.Warn("upstream unhealthy", zap.Stringer("upstream", b), zap.Stringer("was", old),
			zap.Duration("silentFor", silent), zap.Int64("watches", b.OpenWatches()), zap.Int("requestsCut", cut), kind, zap.Error(cause))
		if old != Unknown && silent > 0 && p.opts.OnDetect != nil {
			p.opts.OnDetect(b, "unhealthy", silent)
		}
		b.t.closeIdle()
	}
	if p.opts.OnState != nil {
		p.opts.OnState(b, s)
	}
	p.notifyLocked()
}

func (p *Pool) checkLoop(ctx context.Context, b *Backend) {
	interval := p.opts.HealthInterval
	down := Backoff{Initial: min(time.Second, interval), Max: interval, Jitter: 0.2}
	for ctx.Err() == nil { // the first check at once
		p.check(ctx, b)
		next := interval
		if b.State() == Unhealthy {
			next = down.Next()
		} else {
			down.Reset()
		}
		t := p.clk.NewTimer(next)
		select {
		case <-ctx.Done():
		case <-t.C():
		case <-b.kick:
		}
		t.Stop()
	}
}

// probeDue says whether /readyz is to be asked this round: always while the backend is not
// healthy (to see it recover), else at most every ProbeInterval.
func (p *Pool) probeDue(b *Backend) bool {
	now := p.clk.Now().UnixNano()
	if b.State() == Healthy && now-b.hc.probedAt.Load() < int64(p.opts.ProbeInterval) {
		return false
	}
	b.hc.probedAt.Store(now)
	return true
}

// check runs one round: a /readyz probe when due (in the background when the backend can be
// pinged), and a ping.
func (p *Pool) check(ctx context.Context, b *Backend) {
	if !b.pingable() {
		if p.probeDue(b) {
			p.probe(ctx, b, p.clk.Now().UnixNano())
		}
		return
	}
	start := p.clk.Now().UnixNano()
	if p.probeDue(b) && b.hc.readyBusy.CompareAndSwap(false, true) {
		p.loops.Add(1)
		go func() { // ends within ProbeTimeout
			defer p.loops.Done()
			defer b.hc.readyBusy.Store(false)
			p.probe(ctx, b, start)
		}()
	}
	err := p.ping(ctx, b, start)
	if ctx.Err() != nil {
		return
	}
	if errors.Is(err, errNoH2) {
		p.log.Info("upstream does not speak HTTP/2; judged by its /readyz alone", zap.Stringer("upstream", b))
		b.hc.noH2.Store(true)
		return
	}
	switch {
	case err == nil:
		b.alive()
		b.hc.liveness.Store(livenessAlive)
		if b.hc.pingFailed.Swap(false) {
			// It did not answer for a while and does again: a lag found meanwhile came with that
			// (a short freeze, found lagging before it was found unhealthy) and its cache
			// catches up now.
			p.forgiveLag(b, true)
		}
	case b.hc.aliveAt.Load() > start:
		b.hc.liveness.Store(livenessAlive) // the ping was slow, but the backend answered something
	default:
		b.hc.deadAt.Store(start)
		b.hc.liveness.Store(livenessDead)
	}
	p.judge(b, err)
}

// ping asks whether b answers at all (docs/design.md section 10.9): a PING on the kept
// connection and, when that has no answer within half the ping timeout (or fails before its
// time), one more on a fresh connection of its own; the first ACK wins. Each connection gets
// the whole ping timeout to answer, so a backend that answers neither within it, and sent
// nothing else since start, is found dead one and a half ping timeouts after the first PING
// (the two were tried one after the other before: two timeouts). A refused dial, or a backend
// without HTTP/2, is the answer at once; so is anything the backend sent since start, which
// proves it alive whatever the ping says.
func (p *Pool) ping(ctx context.Context, b *Backend, start int64) error {
	timeout := p.opts.PingTimeout
	first := make(chan error, 1)
	p.loops.Add(1)
	go func() { // ends within timeout; may outlive ping when the fresh connection answers first
		defer p.loops.Done()
		err := b.ping.ping(ctx, p.clk, timeout)
		if err != nil {
			b.hc.pingFailed.Store(true)
		}
		first <- err
	}()
	half := p.clk.NewTimer(timeout / 2)
	defer half.Stop()
	select {
	case err := <-first:
		if err == nil || IsDialError(err) || errors.Is(err, errNoH2) || ctx.Err() != nil || b.hc.aliveAt.Load() > start {
			return err
		}
		return b.spare.once(ctx, p.clk, timeout) // it failed before its time (a GOAWAY, a reset)
	case <-half.C():
	}
	if b.hc.aliveAt.Load() > start {
		return <-first // it sent something meanwhile: alive, whatever this ping says
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	second := make(chan error, 1)
	go func() { second <- b.spare.once(sctx, p.clk, timeout) }()
	var err error
	for range 2 {
		select {
		case err = <-first:
			first = nil
		case err = <-second:
			second = nil
		}
		if err == nil {
			break
		}
	}
	if second != nil {
		cancel()
		<-second
	}
	return err
}

// probe asks /readyz once, sent at sent (Unix ns), and records the verdict.
func (p *Pool) probe(ctx context.Context, b *Backend, sent int64) {
	code, err := b.Probe(ctx, p.opts.ProbeTimeout)
	if ctx.Err() != nil {
		return
	}
	unauthorized := err == nil && (code == 401 || code == 403)
	if unauthorized {
		// Section 10.6: an answer we may not read is no proof of readiness.
		if b.t.probeIdentity || p.anonPassed.Load() {
			why := "not ready until it is authorized (an apiserver answers so until its authorizer has synced)"
			if code == 401 {
				why = "the apiserver does not authenticate it"
			}
			err = classify(fmt.Errorf("/readyz answered %d to %s: %s", code, b.t.probeAs(), why), code)
		}
	} else if err == nil && !b.t.probeIdentity {
		p.anonPassed.Store(true) // anonymous probes are authorized in this cluster
	}
	if prev := b.hc.probeStatus.Swap(int32(code)); prev != int32(code) && unauthorized {
		if err != nil {
			p.log.Warn("upstream answers /readyz with 401 or 403: not ready until it lets watchsan read it",
				zap.Stringer("upstream", b), zap.Int("code", code), zap.String("probeIdentity", b.t.probeAs()), zap.Error(err))
		} else {
			p.log.Warn("upstream answers watchsan's anonymous /readyz with 401 or 403: it is alive, its readiness unknown; counted as ready without proof (a restarting apiserver answers so until it is ready): give watchsan an identity to probe with, --probe-kubeconfig",
				zap.Stringer("upstream", b), zap.Int("code", code))
		}
	}
	if err != nil {
		err = classify(err, code)
	}
	b.hc.readyErr.Store(&readyError{err})
	switch {
	case unauthorized && err == nil:
		b.hc.readiness.Store(readyUnverified)
	case err == nil:
		b.hc.readiness.Store(readyOK)
	case code != 0:
		b.hc.readiness.Store(readyNotReady)
	default:
		b.hc.readiness.Store(readyNoAnswer)
		if IsDialError(err) {
			b.hc.deadAt.Store(sent)
			b.hc.liveness.Store(livenessDead) // refused: nothing listens
		}
	}
	if code != 0 && b.hc.liveness.Load() == livenessDead && sent >= b.hc.deadAt.Load() {
		// It answered a probe sent since it was found dead: it is back. An answer to one sent
		// before (its goroutine late on a loaded machine, a backend that froze after answering
		// it) says nothing of now, and would revive a frozen backend for a round.
		b.hc.liveness.Store(livenessAlive)
	}
	p.judge(b, err)
}

// judge turns the last signals into the backend's state (decide), and records it
// (verdict): the one path of every signal to a state, a probe's, a ping's and a refused
// dial's of real traffic alike.
func (p *Pool) judge(b *Backend, cause error) {
	if cause == nil {
		// A ping that passed says nothing of readiness: when /readyz did not pass, its cause
		// is the backend's (an apiserver refusing watchsan's credentials, not "/readyz did not
		// pass" every other round).
		if r := b.hc.readyErr.Load(); r != nil {
			cause = r.err
		}
	}
	if s, why, ok := decide(b.pingable(), b.hc.liveness.Load(), b.hc.readiness.Load(), b.State(), cause); ok {
		p.verdict(b, s, why)
	}
}

// decide is the verdict of the last signals: liveness (the last ping, or a refused dial),
// readiness (the last /readyz), whether b is pinged, its state now, and the error of the
// signal that asks (nil: none); false when they decide nothing yet. A backend that is not
// pinged is judged by /readyz alone, except that a refused dial makes it unhealthy until an
// answer says otherwise.
func decide(pingable bool, live, ready int32, cur State, cause error) (State, error, bool) {
	if !pingable {
		switch {
		case live == livenessDead && cause != nil:
			return Unhealthy, cause, true
		case ready == readyOK || ready == readyUnverified:
			return Healthy, nil, true
		case ready == readyNotReady:
			return Degraded, cause, true
		case ready == readyNoAnswer:
			return Unhealthy, cause, true
		}
		return cur, nil, false
	}
	switch {
	case live == livenessDead:
		if cause == nil {
			cause = errors.New("no answer to HTTP/2 PING")
		}
		return Unhealthy, cause, true
	case live == livenessUnknown:
	case ready == readyOK || ready == readyUnverified:
		return Healthy, nil, true
	case ready == readyNotReady || ready == readyNoAnswer:
		if cause == nil {
			cause = errors.New("/readyz did not pass")
		}
		return Degraded, cause, true
	case cur == Unhealthy:
		return Degraded, errors.New("it answers pings; /readyz not answered yet"), true
	}
	return cur, nil, false
}

// verdict records a verdict of the health checker: the backend's state (setState) and, with
// it, the cause classified (cause.go), kept in b's Health; a change of cause while the state
// stays is logged once, as setState logs a change of state. The only writer of Health.
func (p *Pool) verdict(b *Backend, s State, cause error) {
	b.hc.record.mu.Lock()
	defer b.hc.record.mu.Unlock()
	var c *Cause
	if cause != nil {
		c = classify(cause, 0)
		cause = c
	}
	var h Health
	if old := b.hc.record.snap.Load(); old != nil {
		h = *old
	}
	was := b.State()
	p.setState(b, s, cause)
	now := p.clk.Now()
	st := b.State()
	if st != was || h.StateSince.IsZero() {
		h.StateSince = now
	}
	h.State = st
	if c != nil {
		if h.LastError == nil || h.LastError.Kind != c.Kind || was == Healthy {
			if st == was && st != Healthy && h.LastError != nil {
				p.log.Warn("upstream still "+st.String()+"; its cause changed", zap.Stringer("upstream", b),
					zap.String("cause", string(c.Kind)), zap.String("was", string(h.LastError.Kind)), zap.Error(c))
			}
			h.ErrorSince = now
		}
		h.LastError, h.ErrorAt = c, now
	}
	b.hc.record.snap.Store(&h)
}

// ReadinessUnverified reports whether b counts as ready without proof: its last /readyz
// answered 401 or 403 to an anonymous probe, in a pool where no anonymous probe has passed
// (docs/design.md section 10.6).
func (b *Backend) ReadinessUnverified() bool { return b.hc.readiness.Load() == readyUnverified }

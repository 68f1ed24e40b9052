package upstream

import (
	"context"
	"errors"
	"fmt"
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
// Traffic adds signals: a refused dial is a verdict at once (passiveFailure); a reset, a lost
// connection or a silent watch asks for a check at once (ReportFailure); watches behind their
// peers on other backends mark it lagging (the mover).

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

func (p *Pool) checkLoop(ctx context.Context, b *Backend) {
	interval := p.opts.HealthInterval
	down := Backoff{Initial: min(time.Second, interval), Max: interval, Jitter: 0.2}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-b.kick:
		}
		p.check(ctx, b)
		next := interval
		if b.State() == Unhealthy {
			next = down.Next()
		} else {
			down.Reset()
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(next)
	}
}

// probeDue says whether /readyz is to be asked this round: always while the backend is not
// healthy (to see it recover), else at most every ProbeInterval.
func (p *Pool) probeDue(b *Backend) bool {
	now := time.Now().UnixNano()
	if b.State() == Healthy && now-b.probedAt.Load() < int64(p.opts.ProbeInterval) {
		return false
	}
	b.probedAt.Store(now)
	return true
}

// check runs one round: a /readyz probe when due (in the background when the backend can be
// pinged), and a ping.
func (p *Pool) check(ctx context.Context, b *Backend) {
	if !b.pingable.Load() {
		if p.probeDue(b) {
			p.probe(ctx, b)
		}
		return
	}
	if p.probeDue(b) && b.readyBusy.CompareAndSwap(false, true) {
		p.loops.Add(1)
		go func() { // ends within ProbeTimeout
			defer p.loops.Done()
			defer b.readyBusy.Store(false)
			p.probe(ctx, b)
		}()
	}
	start := time.Now().UnixNano()
	err := p.ping(ctx, b, start)
	if ctx.Err() != nil {
		return
	}
	if errors.Is(err, errNoH2) {
		p.log.Info("upstream does not speak HTTP/2; judged by its /readyz alone", zap.Stringer("upstream", b))
		b.pingable.Store(false)
		return
	}
	switch {
	case err == nil:
		b.alive()
		b.liveness.Store(livenessAlive)
		if b.pingFailed.Swap(false) && b.laggingTill.Load() != 0 {
			// It did not answer for a while and does again: the lag came with that (a short
			// freeze, found lagging before it was found unhealthy) and its cache catches up now.
			b.laggingTill.Store(0)
			p.log.Info("upstream answers again; no longer held back as lagging", zap.Stringer("upstream", b))
		}
	case b.aliveAt.Load() > start:
		b.liveness.Store(livenessAlive) // the ping was slow, but the backend answered something
	default:
		b.liveness.Store(livenessDead)
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
		err := b.ping.ping(ctx, timeout)
		if err != nil {
			b.pingFailed.Store(true)
		}
		first <- err
	}()
	half := time.NewTimer(timeout / 2)
	defer half.Stop()
	select {
	case err := <-first:
		if err == nil || IsDialError(err) || errors.Is(err, errNoH2) || ctx.Err() != nil || b.aliveAt.Load() > start {
			return err
		}
		return b.spare.once(ctx, timeout) // it failed before its time (a GOAWAY, a reset)
	case <-half.C:
	}
	if b.aliveAt.Load() > start {
		return <-first // it sent something meanwhile: alive, whatever this ping says
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	second := make(chan error, 1)
	go func() { second <- b.spare.once(sctx, timeout) }()
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

// probe asks /readyz once and records the verdict.
func (p *Pool) probe(ctx context.Context, b *Backend) {
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
	if prev := b.probeStatus.Swap(int32(code)); prev != int32(code) && unauthorized {
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
	switch {
	case unauthorized && err == nil:
		b.readiness.Store(readyUnverified)
	case err == nil:
		b.readiness.Store(readyOK)
	case code != 0:
		b.readiness.Store(readyNotReady)
	default:
		b.readiness.Store(readyNoAnswer)
		if IsDialError(err) {
			b.liveness.Store(livenessDead) // refused: nothing listens
		}
	}
	if code != 0 && b.pingable.Load() && b.liveness.Load() == livenessDead {
		b.liveness.Store(livenessAlive) // it answered: it is back
	}
	p.judge(b, err)
}

// judge turns the last verdicts into the backend's state.
func (p *Pool) judge(b *Backend, cause error) {
	live, ready := b.liveness.Load(), b.readiness.Load()
	if !b.pingable.Load() { // /readyz alone
		switch ready {
		case readyOK, readyUnverified:
			p.verdict(b, Healthy, nil)
		case readyNotReady:
			p.verdict(b, Degraded, cause)
		case readyNoAnswer:
			p.verdict(b, Unhealthy, cause)
		}
		return
	}
	switch {
	case live == livenessDead:
		if cause == nil {
			cause = errors.New("no answer to HTTP/2 PING")
		}
		p.verdict(b, Unhealthy, cause)
	case live == livenessUnknown:
	case ready == readyOK || ready == readyUnverified:
		p.verdict(b, Healthy, nil)
	case ready == readyNotReady || ready == readyNoAnswer:
		if cause == nil {
			cause = errors.New("/readyz did not pass")
		}
		p.verdict(b, Degraded, cause)
	case b.State() == Unhealthy:
		p.verdict(b, Degraded, errors.New("it answers pings; /readyz not answered yet"))
	}
}

// verdict records a verdict of the health checker: the backend's state (setState) and, with
// it, the cause classified (cause.go), kept in b's Health; a change of cause while the state
// stays is logged once, as setState logs a change of state. The only writer of Health.
func (p *Pool) verdict(b *Backend, s State, cause error) {
	b.health.mu.Lock()
	defer b.health.mu.Unlock()
	var c *Cause
	if cause != nil {
		c = classify(cause, 0)
		cause = c
	}
	var h Health
	if old := b.health.snap.Load(); old != nil {
		h = *old
	}
	was := b.State()
	p.setState(b, s, cause)
	now := time.Now()
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
	b.health.snap.Store(&h)
}

// ReadinessUnverified reports whether b counts as ready without proof: its last /readyz
// answered 401 or 403 to an anonymous probe, in a pool where no anonymous probe has passed
// (docs/design.md section 10.6).
func (b *Backend) ReadinessUnverified() bool { return b.readiness.Load() == readyUnverified }

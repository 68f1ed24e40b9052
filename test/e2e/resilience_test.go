package e2e

// Resilient watches against real kube-apiservers: an apiserver frozen with SIGSTOP
// (kubernetes#65012), killed and restarted, reset, refusing with 503, stalled, sending GOAWAY,
// and rolled (SIGTERM with a shutdown delay, restart, the next one). Real client-go informers
// watch through watchsan while a writer changes objects directly on an apiserver that is up;
// through watchsan each informer must see one unbroken stream: no relist, no re-watch, no
// error, every change once and in order, a store equal to a fresh list. Every scenario also
// runs a control (the informer straight to the apiserver, or watchsan with
// --disable-watch-resume) that must show the break, so the test can tell resuming from a
// scenario that broke nothing. The harness is in resilience_harness_test.go.

import (
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watchsan/watchsan/internal/faults"
	"github.com/watchsan/watchsan/test/cluster"
)

// TestResilienceSIGSTOP freezes each of two apiservers in turn while informers watch through
// watchsan. With both apiservers behind one watchsan the watches move to the other one within
// a bounded delay: found by the health checker's pings (one watchsan), or by the stall
// watchdog alone (another, whose health checks are a minute apart). A watchsan with only the
// frozen apiserver resumes after SIGCONT. Controls: an informer straight to the frozen
// apiserver gets nothing until SIGCONT; watchsan with resume disabled makes its client
// re-watch. Before each freeze the test reads where each watchsan's watches are (its
// per-upstream open watches), so a freeze that breaks nothing cannot pass for one that was
// survived (balancing places watches on both apiservers).
func TestResilienceSIGSTOP(t *testing.T) {
	c := newCluster(t, cluster.Options{APIServers: 2})
	ns := resilienceNamespace(t, c, "sigstop")
	health := startProxy(t, resilienceProxyArgs(c, 0, 1)...)
	// Health checks a minute apart, pings after a minute: only the stall watchdog can notice.
	stall := startProxy(t, append(resilienceProxyArgs(c, 0, 1), "--health-interval=60s", "--http2-read-idle-timeout=60s", "--http2-ping-timeout=30s")...)
	single := startProxy(t, resilienceProxyArgs(c, 0)...)
	noResume := startProxy(t, append(resilienceProxyArgs(c, 0, 1), "--disable-watch-resume")...)
	proxies := map[string]*proxy{"health": health, "stall": stall, "no-resume": noResume}

	viaHealth := []*countingInformer{
		startCountingInformer(t, "watchsan(health)#1", resilienceClientConfig(c, health), ns),
		startCountingInformer(t, "watchsan(health)#2", resilienceClientConfig(c, health), ns),
	}
	viaStall := startCountingInformer(t, "watchsan(stall)", resilienceClientConfig(c, stall), ns)
	viaSingle := startCountingInformer(t, "watchsan(apiserver-0 only)", resilienceClientConfig(c, single), ns)
	ctlNoResume := startCountingInformer(t, "control: watchsan --disable-watch-resume", resilienceClientConfig(c, noResume), ns)
	ctlDirect := startCountingInformer(t, "control: direct to apiserver-0", c.RESTConfig(0, c.AdminToken), ns)
	resuming := append([]*countingInformer{viaStall}, viaHealth...)

	wr := newRecordingWriter(t, c, ns)
	wr.start(8, 30*time.Millisecond)
	eventually(t, 30*time.Second, "the writer to get going", func() bool { return wr.count() >= 20 })

	hits := map[string]int{} // freezes that found watches of that watchsan on the frozen apiserver
	for _, i := range []int{0, 1} {
		a := c.APIServers[i]
		// The health watchsan's two watches are balanced, one on each apiserver.
		eventually(t, 30*time.Second, "watchsan(health)'s watches one on each apiserver", func() bool {
			return health.Metric("watchsan_upstream_open_watches", map[string]string{"upstream": c.APIServers[0].URL}) == 1 &&
				health.Metric("watchsan_upstream_open_watches", map[string]string{"upstream": c.APIServers[1].URL}) == 1
		})
		var placement []string
		for name, p := range proxies {
			on := p.Metric("watchsan_upstream_open_watches", map[string]string{"upstream": a.URL})
			if on > 0 {
				hits[name]++
			}
			placement = append(placement, fmt.Sprintf("%s %v", name, on))
		}
		slices.Sort(placement)
		t.Logf("apiserver-%d about to freeze; watches on it: %s", i, strings.Join(placement, ", "))
		wr.avoid(i) // writes go on on the other apiserver
		stoppedAt := time.Now()
		if err := a.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Signal(syscall.SIGCONT) }) // a failed test must not leave it frozen
		m := wr.marker(fmt.Sprintf("while-apiserver-%d-frozen", i))
		for _, w := range resuming {
			at := w.waitSeen(t, m, resResumeBound)
			t.Logf("apiserver-%d frozen: %s got the first change made after SIGSTOP %v later", i, w.name, at.Sub(stoppedAt).Round(time.Millisecond))
		}
		if i == 0 {
			// The informers that only know apiserver 0 cannot have it.
			for _, w := range []*countingInformer{viaSingle, ctlDirect} {
				if _, ok := w.seen(m); ok {
					t.Fatalf("%s got %s while apiserver 0 was frozen", w.name, m)
				}
			}
		}
		// Frozen past the stall timeout: the single-apiserver watchsan's watch stalls.
		time.Sleep(time.Until(stoppedAt.Add(resStallTimeout + 1500*time.Millisecond)))
		contAt := time.Now()
		if err := a.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			at := viaSingle.waitSeen(t, m, 30*time.Second)
			t.Logf("apiserver-0 continued after %v frozen: %s resumed and got the change %v after SIGCONT",
				contAt.Sub(stoppedAt).Round(time.Millisecond), viaSingle.name, at.Sub(contAt).Round(time.Millisecond))
			at = ctlDirect.waitSeen(t, m, 30*time.Second)
			t.Logf("%s got it %v after SIGSTOP (only once the apiserver ran again)", ctlDirect.name, at.Sub(stoppedAt).Round(time.Millisecond))
		}
		ctx := ctxT(t, time.Minute)
		if err := a.Ready(ctx); err != nil {
			t.Fatal(err)
		}
		for _, p := range []*proxy{health, noResume} {
			waitUpstreamUp(t, p, a.URL)
		}
		wr.allow(i)
	}

	finishAndCompare(t, wr, append([]*countingInformer{viaSingle}, resuming...), []*countingInformer{ctlNoResume, ctlDirect})
	for _, w := range append([]*countingInformer{viaSingle}, resuming...) {
		w.requireUndisturbed(t)
		t.Logf("%s", w.counts())
	}
	// The one-watch watchsans were hit by one of the two freezes (their watch never had to
	// move otherwise); the health watchsan by both.
	if hits["health"] != 2 || hits["stall"] < 1 || hits["no-resume"] < 1 {
		t.Fatalf("freezes that hit each watchsan's watches: %v; want health 2, stall and no-resume at least 1", hits)
	}
	ctlNoResume.requireDisturbed(t)
	t.Logf("%s", ctlNoResume.counts())
	t.Logf("%s", ctlDirect.counts())

	if n := health.Metric("watchsan_watch_resumes_total", nil); n < 2 {
		t.Errorf("watchsan(health) resumed %v watches, want at least 2 (one per freeze)", n)
	}
	if n := stall.Metric("watchsan_watch_stalls_total", nil); n < 1 {
		t.Errorf("watchsan(stall) counted %v stalls, want at least 1", n)
	}
	if n := stall.Metric("watchsan_watch_resumes_total", map[string]string{"reason": "stall"}); n < 1 {
		t.Errorf("watchsan(stall) resumed %v watches after a stall, want at least 1", n)
	}
	if n := single.Metric("watchsan_watch_resumes_total", nil); n < 1 {
		t.Errorf("watchsan(apiserver-0 only) resumed %v watches, want at least 1", n)
	}
	for name, p := range map[string]*proxy{"health": health, "stall": stall, "apiserver-0 only": single} {
		t.Logf("watchsan(%s): %s", name, resumeSummary(p))
	}
	requireWatching(t, health, len(viaHealth))
	requireWatching(t, stall, 1)
	requireWatching(t, single, 1)
	if n := noResume.Metric("watchsan_watch_stream_ends_total", map[string]string{"reason": "upstream-broke"}); n < 1 {
		t.Errorf("watchsan --disable-watch-resume ended %v client streams for a broken upstream, want at least 1", n)
	}
}

// TestResilienceKillRestart SIGKILLs each of two apiservers mid-watch and restarts it on the
// same port, one after the other, under continuous writes. Through watchsan with both
// apiservers the watches resume at once on the other one, and after the second kill on the
// restarted first one, whose watch cache began at its restart: no relist, no re-watch, nothing
// lost or repeated. A watchsan with only the first apiserver resumes once it is back; but a
// restarted apiserver's watch cache holds no event from before its start, so it answers the
// resume (from before the kill, with changes made in between) with 410 Expired. The typed
// informer's watch (a watch-list, in protobuf, the clientset's default) holds a complete
// state, so watchsan absorbs it (docs/design.md section 12): the informer gets the difference
// and never relists. A plain watch from a client's resourceVersion holds none, and watchsan
// tells its client to relist, once, with a well-formed ERROR event: the one honest ending.
// Controls: direct to the first apiserver, and resume disabled.
func TestResilienceKillRestart(t *testing.T) {
	c := newCluster(t, cluster.Options{APIServers: 2})
	ns := resilienceNamespace(t, c, "kill")
	both := startProxy(t, resilienceProxyArgs(c, 0, 1)...)
	single := startProxy(t, resilienceProxyArgs(c, 0)...)
	noResume := startProxy(t, append(resilienceProxyArgs(c, 0, 1), "--disable-watch-resume")...)
	via := []*countingInformer{
		startCountingInformer(t, "watchsan#1", resilienceClientConfig(c, both), ns),
		startCountingInformer(t, "watchsan#2", resilienceClientConfig(c, both), ns),
	}
	viaSingle := startCountingInformer(t, "watchsan(apiserver-0 only)", resilienceClientConfig(c, single), ns)
	ctlNoResume := startCountingInformer(t, "control: watchsan --disable-watch-resume", resilienceClientConfig(c, noResume), ns)
	ctlDirect := startCountingInformer(t, "control: direct to apiserver-0", c.RESTConfig(0, c.AdminToken), ns)

	wr := newRecordingWriter(t, c, ns)
	wr.start(8, 30*time.Millisecond)
	eventually(t, 30*time.Second, "the writer to get going", func() bool { return wr.count() >= 20 })
	raw := startRawWatch(t, single.URL, c.AdminToken, ns, wr.markerObject("raw-start").ResourceVersion)

	for _, i := range []int{0, 1} {
		a := c.APIServers[i]
		wr.avoid(i)
		killedAt := time.Now()
		if err := a.Kill(); err != nil {
			t.Fatal(err)
		}
		m := wr.marker(fmt.Sprintf("after-apiserver-%d-killed", i))
		for _, w := range via {
			at := w.waitSeen(t, m, resResumeBound)
			t.Logf("apiserver-%d killed: %s got the first change made after the kill %v later", i, w.name, at.Sub(killedAt).Round(time.Millisecond))
		}
		if _, ok := viaSingle.seen(m); ok && i == 0 {
			t.Fatalf("%s got %s while its only apiserver was down", viaSingle.name, m)
		}
		if err := a.Restart(ctxT(t, 2*time.Minute)); err != nil {
			t.Fatal(err)
		}
		readyAt := time.Now()
		t.Logf("apiserver-%d restarted on port %d and ready %v after the kill", i, a.Port, readyAt.Sub(killedAt).Round(time.Millisecond))
		if i == 0 {
			at := viaSingle.waitSeen(t, m, time.Minute)
			t.Logf("%s got it %v after the kill, %v after the apiserver was ready again", viaSingle.name,
				at.Sub(killedAt).Round(time.Millisecond), at.Sub(readyAt).Round(time.Millisecond))
			expiredOnResume(t, raw, single)
		}
		for _, p := range []*proxy{both, noResume} {
			waitUpstreamUp(t, p, a.URL)
		}
		wr.allow(i)
	}

	finishAndCompare(t, wr, via, []*countingInformer{viaSingle, ctlNoResume, ctlDirect})
	for _, w := range via {
		w.requireUndisturbed(t)
	}
	if n := both.Metric("watchsan_watch_resumes_total", nil); n < float64(len(via)) {
		t.Errorf("watchsan resumed %v watches, want at least %d (every watch was on a killed apiserver once)", n, len(via))
	}
	if n := both.Metric("watchsan_watch_relists_forced_total", nil); n != 0 {
		t.Errorf("watchsan with two apiservers told %v clients to relist, want 0", n)
	}
	// The single-apiserver watchsan's informer never relisted: its 410 was absorbed.
	if viaSingle.req.watchLists.Load() != 1 || viaSingle.req.lists.Load() != 0 || viaSingle.req.rewatches.Load() != 0 ||
		viaSingle.req.failures.Load() != 0 || viaSingle.errs.Load() != 0 {
		t.Errorf("%s: want its one watch-list and nothing else (the 410 absorbed, no relist)", viaSingle.counts())
	}
	if n := single.Metric("watchsan_watch_gone_absorbed_total", map[string]string{"outcome": "absorbed"}); n != 1 {
		t.Errorf("watchsan(apiserver-0 only) absorbed %v 410s, want 1 (the typed informer's)", n)
	}
	compareStore(t, wr, viaSingle)
	ctlNoResume.requireDisturbed(t)
	ctlDirect.requireDisturbed(t)
	for _, w := range append(via, viaSingle, ctlNoResume, ctlDirect) {
		t.Logf("%s", w.counts())
	}
	t.Logf("watchsan: %s", resumeSummary(both))
	t.Logf("watchsan(apiserver-0 only): %s", resumeSummary(single))
	requireWatching(t, both, len(via))
}

// expiredOnResume checks how watchsan p ended a plain client's watch (raw, opened before the
// kill) whose resume point the restarted apiserver no longer has: the apiserver answers the
// resume with 200 and an ERROR 410 event (its watch cache's "too old resource version"); the
// client must get that ERROR once, then a clean end, and watchsan must count the forced relist.
// Its watch, from a client's resourceVersion, holds no state to
// absorb the 410 with (docs/design.md section 12); the informers watching through p, from a
// watch-list, absorbed theirs and are not counted.
func expiredOnResume(t *testing.T, raw *rawWatch, p *proxy) {
	t.Run("410-on-resume-ends-the-stream", func(t *testing.T) {
		ended := false
		for deadline := time.Now().Add(15 * time.Second); !ended && len(raw.errorEvents()) < 2 && time.Now().Before(deadline); {
			select {
			case <-raw.ended:
				ended = true
			case <-time.After(20 * time.Millisecond):
			}
		}
		raw.stop()
		<-raw.ended
		errs := raw.errorEvents()
		if !ended || len(errs) != 1 || errs[0] != "ERROR:410" || !errors.Is(raw.err, io.EOF) {
			t.Errorf("plain client: ERROR events %v, stream ended with %v; want one ERROR:410, then a clean end", errs, raw.err)
		}
		if n := p.Metric("watchsan_watch_relists_forced_total", nil); n != 1 {
			t.Errorf("watchsan counted %v forced relists, want 1 (the plain client's 410; the informer's was absorbed)", n)
		}
		if n := p.Metric("watchsan_watch_gone_absorbed_total", map[string]string{"outcome": "not-complete"}); n != 1 {
			t.Errorf("watchsan counted %v 410s not absorbed for want of a complete state, want 1 (the plain client's)", n)
		}
	})
}

// TestResilienceRollingRestart restarts two apiservers one after the other under continuous
// writes, each the way a rolling update does: SIGTERM (the apiserver fails /readyz at once,
// keeps serving for --shutdown-delay-duration, then stops accepting and drains; its open
// watches keep streaming until it gives up on them), then a restart on the same port. The
// first one drains to the end (--request-timeout bounds the drain); the second is SIGKILLed in
// mid-drain, as a pod whose grace period ends. Through watchsan: zero client-visible errors,
// zero relists, zero re-watches, no change lost or repeated, stores equal to a fresh list.
// Controls: direct to the first apiserver, and resume disabled.
func TestResilienceRollingRestart(t *testing.T) {
	c := newCluster(t, cluster.Options{APIServers: 2, APIServerFlags: []string{"--shutdown-delay-duration=2s", "--request-timeout=6s"}})
	ns := resilienceNamespace(t, c, "rolling")
	p := startProxy(t, resilienceProxyArgs(c, 0, 1)...)
	noResume := startProxy(t, append(resilienceProxyArgs(c, 0, 1), "--disable-watch-resume")...)
	via := []*countingInformer{
		startCountingInformer(t, "watchsan#1", resilienceClientConfig(c, p), ns),
		startCountingInformer(t, "watchsan#2", resilienceClientConfig(c, p), ns),
		startCountingInformer(t, "watchsan#3", resilienceClientConfig(c, p), ns),
	}
	ctlNoResume := startCountingInformer(t, "control: watchsan --disable-watch-resume", resilienceClientConfig(c, noResume), ns)
	ctlDirect := startCountingInformer(t, "control: direct to apiserver-0", c.RESTConfig(0, c.AdminToken), ns)

	wr := newRecordingWriter(t, c, ns)
	wr.start(10, 25*time.Millisecond)
	eventually(t, 30*time.Second, "the writer to get going", func() bool { return wr.count() >= 20 })

	for _, i := range []int{0, 1} {
		a := c.APIServers[i]
		wr.avoid(i)
		termAt := time.Now()
		if err := a.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "watchsan to see apiserver-"+fmt.Sprint(i)+" unready", func() bool {
			return p.Metric("watchsan_upstream_up", map[string]string{"upstream": a.URL}) == 0
		})
		if i == 0 {
			if err := a.Wait(ctxT(t, time.Minute)); err != nil {
				t.Fatal(err)
			}
			t.Logf("apiserver-0 drained and exited %v after SIGTERM", time.Since(termAt).Round(time.Millisecond))
		} else {
			// Past the shutdown delay (no new connections), watches still open: the grace
			// period ends.
			eventually(t, 10*time.Second, "apiserver-1 to stop accepting", func() bool {
				conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", a.Port), time.Second)
				if err == nil {
					conn.Close()
				}
				return err != nil
			})
			if !a.Running() {
				t.Fatal("apiserver-1 exited before its drain was cut: the hard cut was not tested")
			}
			if err := a.Kill(); err != nil {
				t.Fatal(err)
			}
			t.Logf("apiserver-1 SIGKILLed mid-drain %v after SIGTERM", time.Since(termAt).Round(time.Millisecond))
		}
		m := wr.marker(fmt.Sprintf("after-apiserver-%d-stopped", i))
		for _, w := range via {
			w.waitSeen(t, m, resResumeBound)
		}
		if err := a.Restart(ctxT(t, 2*time.Minute)); err != nil {
			t.Fatal(err)
		}
		for _, px := range []*proxy{p, noResume} {
			waitUpstreamUp(t, px, a.URL)
		}
		wr.allow(i)
		t.Logf("apiserver-%d back %v after SIGTERM", i, time.Since(termAt).Round(time.Millisecond))
	}

	finishAndCompare(t, wr, via, []*countingInformer{ctlNoResume, ctlDirect})
	for _, w := range via {
		w.requireUndisturbed(t)
		t.Logf("%s", w.counts())
	}
	ctlNoResume.requireDisturbed(t)
	ctlDirect.requireDisturbed(t)
	t.Logf("%s", ctlNoResume.counts())
	t.Logf("%s", ctlDirect.counts())
	if n := p.Metric("watchsan_watch_resumes_total", nil); n < float64(len(via)) {
		t.Errorf("watchsan resumed %v watches, want at least %d", n, len(via))
	}
	if n := p.Metric("watchsan_watch_relists_forced_total", nil); n != 0 {
		t.Errorf("watchsan told %v clients to relist, want 0", n)
	}
	t.Logf("watchsan: %s; %d changes written", resumeSummary(p), wr.count())
	requireWatching(t, p, len(via))
}

// TestResilienceFaultLayer puts the fault layer (served over TLS with HTTP/2, so resets and
// GOAWAY are real frames) in front of a real apiserver and watchsan in front of the layer.
// Each fault gets its own namespace, writer, watchsan and informers; the controls are an
// informer talking to the layer directly and one through watchsan with resume disabled.
func TestResilienceFaultLayer(t *testing.T) {
	c := newCluster(t, cluster.Options{})
	front := newFaultedAPIServer(t, c, 0)
	args := append([]string{"--upstream=" + front.URL, "--upstream-ca-file=" + front.CAFile}, resilienceFlags...)

	// env is one fault's setup: watchsan with resume, watchsan without, informers through
	// each and one straight to the layer, and a writer on the apiserver behind the layer.
	type env struct {
		ns          string
		p, noResume *proxy
		via         *countingInformer
		ctlNoResume *countingInformer
		ctlDirect   *countingInformer
		wr          *recordingWriter
	}
	setup := func(t *testing.T, ns string) *env {
		e := &env{ns: resilienceNamespace(t, c, ns)}
		e.p = startProxy(t, args...)
		e.noResume = startProxy(t, append(args, "--disable-watch-resume")...)
		e.via = startCountingInformer(t, "watchsan", resilienceClientConfig(c, e.p), e.ns)
		e.ctlNoResume = startCountingInformer(t, "control: watchsan --disable-watch-resume", resilienceClientConfig(c, e.noResume), e.ns)
		e.ctlDirect = startCountingInformer(t, "control: direct to the layer", front.directConfig(c), e.ns)
		e.wr = newRecordingWriter(t, c, e.ns)
		return e
	}
	// done checks the watchsan informer against the writer and a fresh list, and that the
	// break showed for the controls.
	done := func(t *testing.T, e *env) {
		front.set(t, faults.Faults{})
		finishAndCompare(t, e.wr, []*countingInformer{e.via}, []*countingInformer{e.ctlNoResume, e.ctlDirect})
		e.via.requireUndisturbed(t)
		e.ctlNoResume.requireDisturbed(t)
		for _, w := range []*countingInformer{e.via, e.ctlNoResume, e.ctlDirect} {
			t.Logf("%s", w.counts())
		}
		t.Logf("watchsan: %s", resumeSummary(e.p))
		requireWatching(t, e.p, 1)
	}

	for _, tc := range []struct {
		name string
		f    faults.Faults
	}{
		{"reset-every-n", faults.Faults{ResetEveryN: 7}},
		{"reset-tcp", faults.Faults{ResetEveryN: 7, ResetTCP: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, tc.name)
			resets := front.layer.Stats().Resets
			front.set(t, tc.f)
			e.wr.start(6, 30*time.Millisecond)
			eventually(t, time.Minute, "a few resets", func() bool { return front.layer.Stats().Resets-resets >= 6 && e.wr.count() >= 60 })
			done(t, e)
			e.ctlDirect.requireDisturbed(t)
			if n := e.p.Metric("watchsan_watch_resumes_total", map[string]string{"reason": "reset"}); n < 2 {
				t.Errorf("watchsan resumed %v watches after a reset, want at least 2", n)
			}
			gaps, _ := resumeGaps(e.p)
			t.Logf("%s: watchsan's break-to-resume gaps: %s", tc.name, gapStats(gaps))
		})
	}

	// GOAWAY on the connection of every watch, with its response headers. Alone it is
	// graceful: the watch goes on and nothing is resumed. With the watches also cut, every
	// resume goes to a connection that has not said GOAWAY.
	t.Run("goaway", func(t *testing.T) {
		front.set(t, faults.Faults{GoAway: true})
		before := front.layer.Stats()
		e := setup(t, "goaway")
		e.wr.start(6, 30*time.Millisecond)
		eventually(t, 30*time.Second, "some changes", func() bool { return e.wr.count() >= 30 })
		m := e.wr.marker("after-goaway")
		for _, w := range []*countingInformer{e.via, e.ctlNoResume, e.ctlDirect} {
			w.waitSeen(t, m, 30*time.Second)
		}
		if got := front.layer.Stats().GoAways - before.GoAways; got < 3 {
			t.Fatalf("the layer sent %d GOAWAYs, want one per watch (3)", got)
		}
		if n := e.p.Metric("watchsan_watch_resumes_total", nil); n != 0 {
			t.Errorf("watchsan resumed %v watches after a graceful GOAWAY, want 0: the stream goes on", n)
		}
		e.via.requireUndisturbed(t)

		conns := front.conns.Load()
		front.set(t, faults.Faults{GoAway: true, ResetEveryN: 10})
		resets := front.layer.Stats().Resets
		eventually(t, time.Minute, "a few resets", func() bool { return front.layer.Stats().Resets-resets >= 6 })
		done(t, e)
		e.ctlDirect.requireDisturbed(t)
		resumes := e.p.Metric("watchsan_watch_resumes_total", map[string]string{"reason": "reset"})
		if resumes < 2 {
			t.Errorf("watchsan resumed %v watches after a reset, want at least 2", resumes)
		}
		// Each watch said GOAWAY on its connection, so each resume needed another one.
		if n := front.conns.Load() - conns; float64(n) < resumes {
			t.Errorf("%d new connections for %v resumes: a resumed watch shared a connection that had said GOAWAY", n, resumes)
		}
		gaps, _ := resumeGaps(e.p)
		t.Logf("goaway: watchsan's break-to-resume gaps: %s", gapStats(gaps))
	})

	// 503 to the first K watch requests: they come before any response, so watchsan's
	// pre-response retries absorb them; a client talking to the layer gets the 503s itself.
	t.Run("503-first-k", func(t *testing.T) {
		ns := resilienceNamespace(t, c, "fail503")
		p := startProxy(t, args...)
		front.set(t, faults.Faults{Fail503FirstK: 2})
		via := startCountingInformer(t, "watchsan", resilienceClientConfig(c, p), ns)
		front.set(t, faults.Faults{Fail503FirstK: 2})
		direct := startCountingInformer(t, "control: direct to the layer", front.directConfig(c), ns)
		front.set(t, faults.Faults{})
		wr := newRecordingWriter(t, c, ns)
		wr.start(6, 30*time.Millisecond)
		eventually(t, 30*time.Second, "some changes", func() bool { return wr.count() >= 30 })
		finishAndCompare(t, wr, []*countingInformer{via, direct}, nil)
		via.requireUndisturbed(t)
		if got := direct.req.failures.Load(); got < 2 {
			t.Errorf("the direct client saw %d failed requests, want the 2 503s (%s)", got, direct.counts())
		}
		if n := p.Metric("watchsan_request_retries_total", map[string]string{"outcome": "retried"}); n < 2 {
			t.Errorf("watchsan retried %v times, want at least 2", n)
		}
		t.Logf("%s", via.counts())
		t.Logf("%s", direct.counts())
		requireWatching(t, p, 1)
	})

	// A watch that stops while its connection stays open and its apiserver answers every
	// probe. watchsan asks for bookmarks on every upstream watch, and while its resource changes
	// an apiserver sends one about every minute, so a watch that hears nothing for the stall
	// timeout is resumed whatever the probes say (the hop between may be what hangs;
	// resuming is lossless), and the upstream stays healthy. Controls: straight to
	// the layer the client hangs for good (client-go's pings are answered); with resume
	// disabled the client re-watches.
	t.Run("stall", func(t *testing.T) {
		e := setup(t, "stall")
		e.wr.start(6, 30*time.Millisecond)
		eventually(t, 30*time.Second, "some changes", func() bool { return e.wr.count() >= 10 })
		front.set(t, faults.Faults{StallAfterN: 1})
		st0 := front.layer.Stats().Stalls
		e.wr.marker("stall-trigger")
		eventually(t, 30*time.Second, "the layer to stall three watches", func() bool { return front.layer.Stats().Stalls-st0 >= 3 })
		stalledAt := time.Now()
		front.set(t, faults.Faults{}) // watches opened from now on flow
		quiet := e.wr.marker("while-stalled")

		at := e.via.waitSeen(t, quiet, resStallTimeout+resResumeSlack)
		t.Logf("stall: the watch went silent while its upstream answered probes; resumed and delivered %v after the stall began", at.Sub(stalledAt).Round(time.Millisecond))
		if n := e.p.Metric("watchsan_watch_resumes_total", map[string]string{"reason": "stall"}); n < 1 {
			t.Errorf("watchsan resumed %v watches after a stall, want at least 1", n)
		}
		// Changes went on during the stall, so the resume delivered them at once: a hang, told
		// apart from a quiet watch (docs/design.md section 2).
		if n := e.p.Metric("watchsan_watch_stalls_hung_total", nil); n < 1 {
			t.Errorf("watchsan counted %v stalls as hangs, want at least 1: the resume delivered the changes held back", n)
		}
		if up := e.p.Metric("watchsan_upstream_up", map[string]string{"upstream": front.URL}); up != 1 {
			t.Errorf("the upstream's health is %v after a stall of one watch, want 1: its probes passed", up)
		}
		e.ctlNoResume.waitSeen(t, quiet, resStallTimeout+resResumeSlack)
		if _, ok := e.ctlDirect.seen(quiet); ok {
			t.Errorf("the direct client got %s through a stalled watch: the layer did not stall it", quiet)
		}
		// The direct client stays stalled (until its watch times out, minutes later), so the
		// end waits only for the others.
		finishAndCompare(t, e.wr, []*countingInformer{e.via}, []*countingInformer{e.ctlNoResume})
		e.via.requireUndisturbed(t)
		e.ctlNoResume.requireDisturbed(t)
		t.Logf("%s", e.via.counts())
		t.Logf("%s", e.ctlNoResume.counts())
		t.Logf("watchsan: %s", resumeSummary(e.p))
		requireWatching(t, e.p, 1)
	})
}

// waitUpstreamUp waits until watchsan p's health check passes for upstream u again.
func waitUpstreamUp(t *testing.T, p *proxy, u string) {
	t.Helper()
	eventually(t, 30*time.Second, "watchsan to see "+u+" healthy", func() bool {
		return p.Metric("watchsan_upstream_up", map[string]string{"upstream": u}) == 1
	})
}

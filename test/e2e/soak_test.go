package e2e

// The soak: three real apiservers on one etcd, a fault layer in front of each,
// watchsan in front of the layers, three real client-go informers through watchsan (JSON,
// protobuf, CBOR), a writer changing configmaps directly on the apiservers without pause, and a
// random schedule of faults, one at a time with recovery between, never all three apiservers
// down: SIGSTOP then SIGCONT, SIGKILL then restart, a rolling SIGTERM restart of all three,
// the layer's resets, 503 storms and immediate ends, and forced compactions of etcd (every watch
// cut, the resumes then answered 410: soak_compact_test.go). Every second it samples watchsan's CPU,
// RSS and goroutines, the requests reaching the apiservers and what the clients did; at the end
// it prints a table per 10 s and the totals, and fails on any event lost, duplicated or going
// back in resourceVersion, on a store that differs from a fresh list, on an upstream request
// storm and on unbounded RSS growth. Re-watches and relists are reported, not failed.
//
//	make soak SOAK_DURATION=10m SOAK_SEED=42     # or:
//	WATCHSAN_SOAK_DURATION=10m WATCHSAN_SOAK_SEED=42 go test ./test/e2e -run '^TestSoak$' -v
//
// Without WATCHSAN_SOAK_DURATION the soak is the short version `make test` runs (about 60 s
// of faults: every kind once). The seed is printed first; the same seed gives the same
// schedule (the timing of a real cluster still varies).
//
// WATCHSAN_SOAK_SHARE=1 (make soak SOAK_SHARE=1) is the soak of shared watch feeds
// (design.md section 11): watchsan lends an identity (a kubeconfig with the admin token; the
// clients send none, as a sidecar's controller does) with --share-watches, and runs
// soakSharePerCodec identical informers per codec whose re-watches time out after
// soakShareRewatch, so their watches keep joining the feeds. The audit and the store
// comparison run on every informer as without sharing; the soak also fails unless clients did
// join feeds (watchsan_shared_feed_joins_total) and a feed was seen open (watchsan_shared_feeds).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/watchsan/watchsan/internal/faults"
	"github.com/watchsan/watchsan/internal/watch"
	"github.com/watchsan/watchsan/test/cluster"
)

const (
	// soakShort is the fault phase without WATCHSAN_SOAK_DURATION: long enough for one of each
	// fault kind (the first round always runs them all, even past the duration).
	soakShort = 60 * time.Second
	// soakBucket is one row of the report.
	soakBucket = 10 * time.Second
	// soakPace is the writer's: one change every pace (create, update, update, delete, ...
	// over soakObjects objects).
	soakPace    = 40 * time.Millisecond
	soakObjects = 16
	// soakCatchUp bounds the time from the end of a fault to every informer having the
	// writer's latest change: a watch that does not recover within it is a failure in itself.
	soakCatchUp = 60 * time.Second
	// soakRelistSlack: a change superseded within this long after a relist started may be
	// missing from the informer's history (the list only shows the state; retries inside
	// watchsan can delay the list by up to its retry budget, 10 s).
	soakRelistSlack = 15 * time.Second
	// soakRelistLead: how long before a relist a change may have been missed by the broken
	// watch that led to it (watchsan retries a broken watch for up to its resume timeout, 60 s,
	// before it gives up and the client starts over).
	soakRelistLead = 90 * time.Second

	// soakMaxReqPerSec bounds the upstream requests per second (all three layers together,
	// averaged over a report bucket). The steady load is watchsan's health checks (3 upstreams
	// every 500 ms: 6/s) plus a few watches; a fault adds a resume per watch (3 informers), a
	// few retries with backoff and the clients' own re-watches: tens per bucket, not per
	// second. A resume or retry loop without backoff on loopback makes hundreds to thousands
	// per second, which this catches with a wide margin for -race and a busy machine.
	soakMaxReqPerSec = 60
	// soakRSSFactor and soakRSSSlackMB bound watchsan's RSS: its peak after the first bucket
	// must stay below max(factor × the first bucket's, first + slack). A leak of buffers or
	// goroutines per resume or per watch (thousands of them in a 10-minute soak) grows far
	// beyond; the race detector's own overhead (watchsan is built with -race) stays within.
	soakRSSFactor  = 2.5
	soakRSSSlackMB = 150

	// soakSharePerCodec is how many identical informers per codec the sharing soak runs: one
	// feed per codec (the Accept header is in the feed's key), several subscribers each.
	soakSharePerCodec = 3
	// soakShareRewatch is the timeoutSeconds of the sharing soak's watches (client-go's are 5
	// to 10 minutes): every informer re-watches from its last resourceVersion this often, which
	// joins the feed its codec's other informers hold, so joins happen throughout the fault
	// schedule and not only once per informer. The watch-lists that start an informer and its
	// relists stay private (design.md section 11); the first re-watch comes when the
	// watch-list's stream times out.
	soakShareRewatch = 10 * time.Second
)

// soakShare reports whether WATCHSAN_SOAK_SHARE asks for the sharing soak.
func soakShare(t *testing.T) bool {
	switch v := os.Getenv("WATCHSAN_SOAK_SHARE"); v {
	case "", "0":
		return false
	case "1":
		return true
	default:
		t.Fatalf("WATCHSAN_SOAK_SHARE=%q: want 1 (shared watch feeds) or 0", v)
		return false
	}
}

// soakSettings reads the duration and the seed from the environment.
func soakSettings(t *testing.T) (time.Duration, uint64) {
	d := soakShort
	if v := os.Getenv("WATCHSAN_SOAK_DURATION"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil || d <= 0 {
			t.Fatalf("WATCHSAN_SOAK_DURATION=%q: want a positive duration such as 10m", v)
		}
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("WATCHSAN_SOAK_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("WATCHSAN_SOAK_SEED=%q: want an unsigned integer", v)
		}
	}
	return d, seed
}

func TestSoak(t *testing.T) {
	duration, seed := soakSettings(t)
	share := soakShare(t)
	t.Logf("soak: duration %v, seed %d, shared watch feeds %v (rerun with WATCHSAN_SOAK_SEED=%d)", duration, seed, share, seed)
	enableCBORClients(t)

	c := newCluster(t, cluster.Options{
		APIServers:   3,
		FeatureGates: "CBORServingAndStorage=true",
		// A rolling restart's drain ends within the request timeout; the schedule's grace
		// period is sometimes shorter (a SIGKILL mid-drain), sometimes longer.
		// The compaction faults' resource is served from etcd (soak_compact_test.go).
		APIServerFlags: []string{"--shutdown-delay-duration=1s", "--request-timeout=5s", soakCompactFlag},
	})
	ns := resilienceNamespace(t, c, "soak")
	s := &soak{t: t, c: c, rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), fault: "none", share: share}
	args := append([]string{}, resilienceFlags...)
	for i := range c.APIServers {
		f := newFaultedAPIServer(t, c, i)
		s.fronts = append(s.fronts, f)
		// httptest serves every layer with the same built-in certificate: one CA file.
		args = append(args, "--upstream="+f.URL)
	}
	args = append(args, "--upstream-ca-file="+s.fronts[0].CAFile)
	if share {
		args = append(args, s.lendArgs()...)
	}
	s.p = startProxy(t, args...)
	// Registered after startProxy, so it runs while watchsan still answers.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		if !s.reported && !s.start.IsZero() {
			// Stopped early (a harness failure or a watch that never recovered): what was
			// measured until then, without the audit.
			t.Log("\n" + s.report(nil))
		}
		t.Logf("reproduce with WATCHSAN_SOAK_SEED=%d WATCHSAN_SOAK_DURATION=%v WATCHSAN_SOAK_SHARE=%d", seed, duration, map[bool]int{false: 0, true: 1}[share])
	})

	for _, cd := range []sanCodec{sanCodecJSON, sanCodecProtobuf, sanCodecCBOR} {
		cfg := resilienceClientConfig(c, s.p)
		if !share {
			cfg.ContentType, cfg.AcceptContentTypes = cd.contentType, cd.accept
			s.infs = append(s.infs, startCountingInformer(t, cd.name, cfg, ns))
			continue
		}
		// The lent identity's clients send no credentials of their own.
		cfg.BearerToken = ""
		cfg.ContentType, cfg.AcceptContentTypes = cd.contentType, cd.accept
		for i := range soakSharePerCodec {
			name := fmt.Sprintf("%s#%d", cd.name, i+1)
			s.infs = append(s.infs, startCountingInformerWatching(t, name, cfg, ns, soakShareRewatch))
		}
	}
	s.sec = newSoakSecrets(t, c, ns)
	secCfg := resilienceClientConfig(c, s.p)
	if share {
		secCfg.BearerToken = ""
	}
	s.startSecretInformers(resilienceClientConfig(c, s.p), secCfg, ns)
	s.wr = newRecordingWriter(t, c, ns)
	s.wr.start(soakObjects, soakPace)
	eventually(t, 30*time.Second, "the writer to get going", func() bool { return s.wr.count() >= 20 })

	s.start = time.Now()
	stopSampling := s.sample()
	s.schedule(duration)
	s.setFault("finish")

	// The end: no more changes but one last object; once every informer has it, it has had
	// every change before it (one watch stream is in resourceVersion order).
	s.wr.stop()
	last := s.wr.markerObject("zz-final")
	lastRV, _ := strconv.ParseUint(last.ResourceVersion, 10, 64)
	s.waitCaughtUp(lastRV, "the final change")
	stopSampling()

	if errs := s.wr.errors(); len(errs) > 0 {
		t.Errorf("the writer failed: %v", errs)
	}
	audits := make([]soakAudit, len(s.infs))
	for i, w := range s.infs {
		audits[i] = auditHistory(s.wr.history(), w.history(), w.req.relists())
		compareStore(t, s.wr, w)
	}
	s.secAudits = s.finishSecrets()
	report := s.report(audits)
	t.Log("\n" + report)
	s.reported = true
	if path := os.Getenv("WATCHSAN_SOAK_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
			t.Errorf("writing the report: %v", err)
		}
	}
	for i, a := range audits {
		if a.failed() {
			t.Errorf("%s: %d lost, %d duplicated, %d regressing (%d per object, %d across objects), %d unexpected, %d with the wrong type; first problems:\n  %s",
				s.infs[i].name, a.lost-a.excused, a.dups, a.regress+a.reorder, a.regress, a.reorder, a.unknown, a.wrongType, strings.Join(a.problems, "\n  "))
		}
	}
	s.checkBounds()
	s.checkCompactions(s.secAudits)
	if share {
		s.checkShared()
	}
	requireWatching(t, s.p, len(s.infs))
}

// lendArgs are watchsan's flags for the sharing soak: a kubeconfig with the cluster's admin
// token naming the first fault layer (all three serve the same certificate), the other two
// allowed to get it too, and --share-watches.
func (s *soak) lendArgs() []string {
	kc := filepath.Join(s.t.TempDir(), "lent.kubeconfig")
	if err := s.c.WriteKubeconfig(kc, s.fronts[0].URL, s.c.AdminToken, s.fronts[0].CAFile); err != nil {
		s.t.Fatal(err)
	}
	args := []string{"--kubeconfig=" + kc, "--share-watches"}
	for _, f := range s.fronts[1:] {
		args = append(args, "--allow-credentials-to-upstream="+f.URL)
	}
	return args
}

// checkShared fails the sharing soak unless its clients' watches did share feeds: clients
// joined a feed another client's watch had opened, and a feed was seen open.
func (s *soak) checkShared() {
	sh := s.shareTotals()
	if sh.joins <= 0 {
		s.t.Errorf("sharing on: no client watch joined a shared feed (watchsan_shared_feed_joins_total %v)", sh.joins)
	}
	if sh.peakFeeds <= 0 {
		s.t.Errorf("sharing on: no shared feed was seen open (watchsan_shared_feeds peak %v)", sh.peakFeeds)
	}
}

// soakShareTotals is what the sharing soak reports of the feeds.
type soakShareTotals struct {
	joins                        float64 // watchsan_shared_feed_joins_total at the end
	peakFeeds, peakSubscribers   float64 // the highest values sampled
	upstreamWatches, clientWatch int64   // watch requests reaching the apiservers, and sent by the informers
}

func (s *soak) shareTotals() soakShareTotals {
	s.mu.Lock()
	samples := slices.Clone(s.samples)
	s.mu.Unlock()
	var sh soakShareTotals
	for _, smp := range samples {
		sh.peakFeeds = max(sh.peakFeeds, smp.SharedFeeds)
		sh.peakSubscribers = max(sh.peakSubscribers, smp.Subscribers)
		sh.joins = max(sh.joins, smp.Joins)
	}
	sh.joins = max(sh.joins, s.p.Metric("watchsan_shared_feed_joins_total", nil))
	sh.upstreamWatches = s.layerStats().Watches
	for _, w := range s.infs {
		sh.clientWatch += w.req.watchLists.Load() + w.req.rewatches.Load()
	}
	return sh
}

// soak is one soak run.
type soak struct {
	t      *testing.T
	c      *cluster.Cluster
	fronts []*faultedAPIServer
	p      *proxy
	wr     *recordingWriter
	infs   []*countingInformer
	rng    *rand.Rand
	start  time.Time

	mu      sync.Mutex
	fault   string       // what is going on now, for the report
	samples []soakSample // one per second
	log     []string     // the schedule as it ran
	// missedScrapes counts samples whose metrics scrape failed (watchsan's admin listener
	// did not answer within 2 s).
	missedScrapes int
	kinds         map[string]int
	share         bool // the sharing soak (WATCHSAN_SOAK_SHARE=1)
	// The compaction faults (soak_compact_test.go): the secrets writer and informers, what
	// each fault did, and the secrets informers' audits once the soak ended.
	sec         *soakSecrets
	secInfs     []*countingInformer
	compactions []soakCompaction
	secAudits   []soakAudit
	stuck       bool // a recovery timed out: the schedule stopped early
	reported    bool // the report was printed
}

func (s *soak) since() time.Duration { return time.Since(s.start).Truncate(100 * time.Millisecond) }

func (s *soak) setFault(f string) {
	s.mu.Lock()
	s.fault = f
	s.mu.Unlock()
}

func (s *soak) logf(format string, args ...any) {
	line := fmt.Sprintf("%7.1fs ", s.since().Seconds()) + fmt.Sprintf(format, args...)
	s.mu.Lock()
	s.log = append(s.log, line)
	s.mu.Unlock()
	s.t.Log(line)
}

// ---- the schedule ----

// soakFault is one kind of fault; run injects it and returns once it is over (the apiservers
// running again, the layers clean), not necessarily once everything recovered.
type soakFault struct {
	name string
	run  func(s *soak)
}

var soakFaults = []soakFault{
	{"sigstop", (*soak).sigstop},
	{"kill-restart", (*soak).killRestart},
	{"rolling-restart", (*soak).rollingRestart},
	{"resets", (*soak).resets},
	{"503-storm", (*soak).storm503},
	{"immediate-ends", (*soak).immediateEnds},
	{"compact", (*soak).compact},
}

// schedule runs faults until d has passed: first every kind once in a random order, then
// random kinds; after each, a recovery (every apiserver ready and healthy in watchsan's eyes,
// every informer caught up with the writer) and a short quiet spell.
func (s *soak) schedule(d time.Duration) {
	s.kinds = map[string]int{}
	order := slices.Clone(soakFaults)
	s.rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	for n := 0; n < len(order) || time.Since(s.start) < d; n++ {
		f := soakFaults[s.rng.IntN(len(soakFaults))]
		if n < len(order) {
			f = order[n]
		}
		s.kinds[f.name]++
		f.run(s)
		s.setFault("recovery")
		if !s.recover(f.name) {
			s.stuck = true
			return
		}
		s.setFault("none")
		s.quiet(s.between(time.Second, 3*time.Second))
	}
}

// between is a random duration in [lo, hi).
func (s *soak) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(s.rng.Int64N(int64(hi-lo)))
}

// quiet waits d (nothing to wait for: the schedule's own pacing).
func (s *soak) quiet(d time.Duration) { time.Sleep(d) }

// recover waits until every apiserver is ready, watchsan sees every layer healthy, and every
// informer has the writer's latest change; it reports whether that happened in time.
func (s *soak) recover(after string) bool {
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, a := range s.c.APIServers {
		if err := a.Ready(ctx); err != nil {
			s.t.Errorf("after %s: apiserver-%d not ready: %v", after, a.Index, err)
			return false
		}
	}
	for _, f := range s.fronts {
		waitUpstreamUp(s.t, s.p, f.URL)
	}
	ok := s.waitCaughtUp(s.wr.lastRV(), "recovery after "+after)
	s.logf("recovered from %s in %v", after, time.Since(t0).Round(100*time.Millisecond))
	return ok
}

// waitCaughtUp waits up to soakCatchUp until every informer got an event at or above rv.
func (s *soak) waitCaughtUp(rv uint64, what string) bool {
	deadline := time.Now().Add(soakCatchUp)
	for {
		var behind []string
		for _, w := range s.infs {
			if got := w.highestRV(); got < rv {
				behind = append(behind, fmt.Sprintf("%s at %d", w.name, got))
			}
		}
		if len(behind) == 0 {
			return true
		}
		if time.Now().After(deadline) {
			s.t.Errorf("%s: informers still behind resourceVersion %d after %v: %v; %s", what, rv, soakCatchUp,
				behind, resumeSummary(s.p))
			for _, w := range s.infs {
				s.t.Logf("%s", w.counts())
			}
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// byWatches returns the apiserver indexes in random order, those serving watchsan's watches
// now (through their layer) first: a fault on an apiserver no watch uses tests nothing.
func (s *soak) byWatches() []int {
	idx := s.rng.Perm(len(s.c.APIServers))
	slices.SortStableFunc(idx, func(a, b int) int {
		wa, wb := s.fronts[a].watching.Load() > 0, s.fronts[b].watching.Load() > 0
		switch {
		case wa && !wb:
			return -1
		case wb && !wa:
			return 1
		}
		return 0
	})
	return idx
}

// pickServer returns an apiserver index, one that serves a watch if any does.
func (s *soak) pickServer() int { return s.byWatches()[0] }

// pickServers returns one or two distinct apiserver indexes, never all three, those serving
// watches first.
func (s *soak) pickServers() []int { return s.byWatches()[:1+s.rng.IntN(2)] }

func (s *soak) ctx(d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	s.t.Cleanup(cancel)
	return ctx
}

// sigstop freezes one apiserver for a few seconds (kubernetes#65012: a hung apiserver whose
// connections stay open). The writer keeps off it meanwhile: a request frozen with it could
// land after later changes.
func (s *soak) sigstop() {
	// Shorter than the stall timeout plus the probe's (3 s + 5 s) the watch only pauses;
	// longer, watchsan's stall watchdog moves it to another apiserver.
	i, hold := s.pickServer(), s.between(4*time.Second, 14*time.Second)
	a := s.c.APIServers[i]
	s.setFault(fmt.Sprintf("sigstop(%d)", i))
	s.logf("SIGSTOP apiserver-%d (serving %d watches) for %v", i, s.fronts[i].watching.Load(), hold.Round(100*time.Millisecond))
	s.wr.avoid(i)
	if err := a.Signal(syscall.SIGSTOP); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = a.Signal(syscall.SIGCONT) })
	time.Sleep(hold)
	if err := a.Signal(syscall.SIGCONT); err != nil {
		s.t.Fatal(err)
	}
	if err := a.Ready(s.ctx(time.Minute)); err != nil {
		s.t.Fatal(err)
	}
	s.wr.allow(i)
}

// killRestart SIGKILLs one apiserver and restarts it on the same port after a moment; its
// watch cache starts over empty.
func (s *soak) killRestart() {
	i, down := s.pickServer(), s.between(500*time.Millisecond, 3*time.Second)
	a := s.c.APIServers[i]
	s.setFault(fmt.Sprintf("kill(%d)", i))
	s.logf("SIGKILL apiserver-%d (serving %d watches), restart after %v", i, s.fronts[i].watching.Load(), down.Round(100*time.Millisecond))
	s.wr.avoid(i)
	if err := a.Kill(); err != nil {
		s.t.Fatal(err)
	}
	time.Sleep(down)
	if err := a.Restart(s.ctx(2 * time.Minute)); err != nil {
		s.t.Fatal(err)
	}
	s.wr.allow(i)
}

// rollingRestart restarts all three apiservers one after the other, each as a rolling update
// does: SIGTERM (unready at once, serving for --shutdown-delay-duration, then draining its
// watches until --request-timeout), a grace period that sometimes ends in SIGKILL mid-drain,
// a restart, and the next one once watchsan sees the restarted one healthy.
func (s *soak) rollingRestart() {
	order := s.rng.Perm(len(s.c.APIServers))
	s.logf("rolling restart, order %v", order)
	for _, i := range order {
		a := s.c.APIServers[i]
		grace := s.between(time.Second, 8*time.Second)
		s.setFault(fmt.Sprintf("rolling(%d)", i))
		watches := s.fronts[i].watching.Load()
		s.wr.avoid(i)
		termAt := time.Now()
		if err := a.Signal(syscall.SIGTERM); err != nil {
			s.t.Fatal(err)
		}
		how := "drained and exited"
		if err := a.Wait(s.ctx(grace)); err != nil {
			how = "SIGKILLed mid-drain"
			if err := a.Kill(); err != nil {
				s.t.Fatal(err)
			}
		}
		if err := a.Restart(s.ctx(2 * time.Minute)); err != nil {
			s.t.Fatal(err)
		}
		waitUpstreamUp(s.t, s.p, s.fronts[i].URL)
		s.wr.allow(i)
		s.logf("  apiserver-%d (serving %d watches) %s (grace %v), back after %v", i, watches, how,
			grace.Round(100*time.Millisecond), time.Since(termAt).Round(100*time.Millisecond))
	}
}

// layerFault sets f on the layers of servers for d, then clears them.
func (s *soak) layerFault(name string, servers []int, f faults.Faults, d time.Duration) {
	s.setFault(fmt.Sprintf("%s%v", name, servers))
	var watches int64
	for _, i := range servers {
		watches += s.fronts[i].watching.Load()
	}
	before := s.layerStats()
	for _, i := range servers {
		s.fronts[i].set(s.t, f)
	}
	time.Sleep(d)
	for _, i := range servers {
		s.fronts[i].set(s.t, faults.Faults{})
	}
	after := s.layerStats()
	s.logf("%s on apiservers %v (serving %d watches) for %v (%s): %d resets, %d 503s, %d ended at once, %d watch requests",
		name, servers, watches, d.Round(100*time.Millisecond), f, after.Resets-before.Resets, after.Refused503-before.Refused503,
		after.EndedImmediately-before.EndedImmediately, after.Watches-before.Watches)
}

// resets: the layer breaks every watch after a few events (RST_STREAM, or a TCP reset of the
// whole connection).
func (s *soak) resets() {
	f := faults.Faults{ResetEveryN: 3 + s.rng.IntN(8), ResetTCP: s.rng.IntN(2) == 0}
	s.layerFault("resets", s.pickServers(), f, s.between(3*time.Second, 8*time.Second))
}

// storm503: two apiservers shutting down as seen from outside: every new watch refused with
// 503 (Retry-After: 1), every running one ended. Two, because a watch ended on one of them
// resumes on another, which is then as likely to refuse it as not; with one, the resume
// never meets a 503.
func (s *soak) storm503() {
	f := faults.Faults{Fail503FirstK: 1 << 30, EndImmediately: true}
	s.layerFault("503-storm", s.byWatches()[:2], f, s.between(3*time.Second, 8*time.Second))
}

// immediateEnds: every watch ends cleanly at once, before its first event or after its next.
func (s *soak) immediateEnds() {
	s.layerFault("immediate-ends", s.pickServers(), faults.Faults{EndImmediately: true}, s.between(3*time.Second, 8*time.Second))
}

func (s *soak) layerStats() faults.Stats {
	var sum faults.Stats
	for _, f := range s.fronts {
		st := f.layer.Stats()
		sum.Requests += st.Requests
		sum.Watches += st.Watches
		sum.Resets += st.Resets
		sum.Refused503 += st.Refused503
		sum.EndedImmediately += st.EndedImmediately
	}
	return sum
}

// ---- sampling ----

// soakSample is what the sampler saw at one moment; counters are cumulative.
type soakSample struct {
	At         time.Duration
	Fault      string
	CPU        time.Duration // watchsan's utime+stime
	RSSMB      float64
	Goroutines float64
	Requests   int64 // reaching the apiservers through the layers
	Resumes    float64
	Rewatches  int64 // all informers
	Relists    int64
	// watchsan's shared feeds (0 without --share-watches): open feeds, their subscribers,
	// joins so far.
	SharedFeeds, Subscribers, Joins float64
}

// sample starts the sampler, one sample a second; the returned func stops it after a last one
// (it also runs in t.Cleanup, so a test that stops early leaves no sampler behind).
func (s *soak) sample() (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	var once sync.Once
	stop = func() { once.Do(func() { close(done); <-finished }) }
	s.t.Cleanup(stop)
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			s.takeSample()
			select {
			case <-done:
				s.takeSample()
				return
			case <-t.C:
			}
		}
	}()
	return stop
}

func (s *soak) takeSample() {
	pid := s.p.cmd.Process.Pid
	cpu, err := procCPU(pid)
	if err != nil {
		s.t.Logf("sampling watchsan's CPU: %v", err)
	}
	rss, err := procRSSMB(pid)
	if err != nil {
		s.t.Logf("sampling watchsan's RSS: %v", err)
	}
	smp := soakSample{At: time.Since(s.start), CPU: cpu, RSSMB: rss, Requests: s.layerStats().Requests}
	if m, err := scrapeMetrics(s.p.AdminURL, "go_goroutines", "watchsan_watch_resumes_total", "watchsan_shared_feeds",
		"watchsan_shared_feed_subscribers", "watchsan_shared_feed_joins_total"); err == nil {
		smp.Goroutines, smp.Resumes = m["go_goroutines"], m["watchsan_watch_resumes_total"]
		smp.SharedFeeds, smp.Subscribers, smp.Joins = m["watchsan_shared_feeds"], m["watchsan_shared_feed_subscribers"], m["watchsan_shared_feed_joins_total"]
	} else {
		// The last values stand in (a missed scrape must not look like a drop to zero).
		s.mu.Lock()
		s.missedScrapes++
		if n := len(s.samples); n > 0 {
			prev := s.samples[n-1]
			smp.Goroutines, smp.Resumes = prev.Goroutines, prev.Resumes
			smp.SharedFeeds, smp.Subscribers, smp.Joins = prev.SharedFeeds, prev.Subscribers, prev.Joins
		}
		s.mu.Unlock()
		s.t.Logf("scraping watchsan's metrics: %v", err)
	}
	for _, w := range s.infs {
		smp.Rewatches += w.req.rewatches.Load()
		smp.Relists += w.relists()
	}
	s.mu.Lock()
	smp.Fault = s.fault
	s.samples = append(s.samples, smp)
	s.mu.Unlock()
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat's times: 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// procCPU returns the user plus system CPU time process pid has used.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces; fields count after it.
	rest := string(b)
	if i := strings.LastIndexByte(rest, ')'); i >= 0 {
		rest = rest[i+1:]
	}
	f := strings.Fields(rest) // f[0] is field 3 (state); utime is field 14, stime 15
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// procRSSMB returns process pid's resident set size (VmRSS) in MiB.
func procRSSMB(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// scrapeMetrics reads the named metrics (summed over their labels) from watchsan's admin
// listener.
func scrapeMetrics(adminURL string, names ...string) (map[string]float64, error) {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(adminURL + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, n := range names {
		out[n] = sumMetric(bytes.NewReader(body), n, nil)
	}
	return out, nil
}

// ---- the audit ----

// soakAudit compares what one informer's handlers got with what the writer did.
type soakAudit struct {
	written, seen, resyncs, tombstones int
	// lost: changes never seen; excused: those of them a relist may legitimately skip (the
	// change was superseded before the relist's list could show it).
	lost, excused int
	dups          int // a change seen more than once
	unknown       int // an event matching no change
	wrongType     int // ADDED where the writer updated, or the reverse, outside a relist
	regress       int // an object's resourceVersion going backwards or repeating
	reorder       int // the stream's resourceVersion going backwards across objects
	problems      []string
}

func (a *soakAudit) failed() bool {
	return a.lost-a.excused > 0 || a.dups > 0 || a.unknown > 0 || a.wrongType > 0 || a.regress > 0 || a.reorder > 0
}

func (a *soakAudit) problem(format string, args ...any) {
	if len(a.problems) < 8 {
		a.problems = append(a.problems, fmt.Sprintf(format, args...))
	}
}

// changeKey identifies a change across the writer's record and the handlers' events: the
// writer's sequence number is unique per create and update, and a delete carries the one of
// the state it deleted.
func changeKey(c cmChange) string {
	if c.Type == "DELETED" {
		return c.Name + "/" + c.Seq + "/deleted"
	}
	return c.Name + "/" + c.Seq
}

// auditHistory checks an informer's events (got, in delivery order) against the writer's
// changes (want, per object, in order), knowing when the informer relisted. Resyncs (updates
// without change, from a relist) are counted apart; tombstones (deletes a relist inferred)
// stand for the writer's delete of that object.
func auditHistory(want map[string][]cmChange, got []cmChange, relists []time.Time) soakAudit {
	var a soakAudit
	inRelist := func(at time.Time) bool {
		for _, r := range relists {
			if !at.Before(r) && at.Before(r.Add(soakRelistSlack)) {
				return true
			}
		}
		return false
	}
	// skippedByRelist: a change made shortly before a relist (while the broken watch that led
	// to it was being retried) and superseded before the relist's list was taken.
	skippedByRelist := func(made, superseded time.Time) bool {
		for _, r := range relists {
			if made.After(r.Add(-soakRelistLead)) && superseded.Before(r.Add(soakRelistSlack)) {
				return true
			}
		}
		return false
	}
	seen := map[string][]cmChange{}
	tombstones := map[string][]cmChange{}
	lastByName := map[string]uint64{}
	var lastRV uint64
	var lastEv cmChange
	for _, e := range got {
		switch {
		case e.Resync:
			a.resyncs++
			continue
		case e.Tombstone:
			a.tombstones++
			tombstones[e.Name] = append(tombstones[e.Name], e)
			continue
		}
		a.seen++
		seen[changeKey(e)] = append(seen[changeKey(e)], e)
		rv, err := strconv.ParseUint(e.RV, 10, 64)
		if err != nil {
			a.regress++
			a.problem("%v: resourceVersion not an integer", e)
			continue
		}
		// An absorbed 410's deletes carry exactly the last delivered resourceVersion
		// (docs/design.md section 12, "The deletes at exactly R"): a DELETED at the
		// object's or the stream's last resourceVersion repeats it and goes back from neither.
		atR := e.Type == "DELETED"
		if prev, ok := lastByName[e.Name]; ok && (rv < prev || rv == prev && !atR) {
			a.regress++
			a.problem("%v at %s: the object's resourceVersion went from %d to %d", e, e.At.Format("15:04:05.000"), prev, rv)
		}
		lastByName[e.Name] = max(lastByName[e.Name], rv)
		if (rv < lastRV || rv == lastRV && !atR) && !e.Initial && !inRelist(e.At) {
			a.reorder++
			a.problem("%v at %s after %v: the stream's resourceVersion went back", e, e.At.Format("15:04:05.000"), lastEv)
		}
		if rv > lastRV {
			lastRV, lastEv = rv, e
		}
	}
	known := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		ops := want[name]
		for i, w := range ops {
			a.written++
			k := changeKey(w)
			known[k] = true
			evs := seen[k]
			switch {
			case len(evs) == 0:
				// A relist shows only the state: a change superseded (by the object's next
				// change) before the list was taken may be missing; a delete shows as a
				// tombstone.
				var next time.Time
				if i+1 < len(ops) {
					next = ops[i+1].At
				}
				excused := false
				switch {
				case w.Type == "DELETED" && i > 0:
					// The state it deleted is ops[i-1]. A tombstone after that state was written
					// stands for the delete: it can come before the writer recorded the delete,
					// whose answer arrives after the server did it (later still when a retry of
					// a delete whose first answer was lost got NotFound). And a whole life, from
					// its create to this delete, that fell around a relist and none of whose
					// states the informer saw leaves nothing to delete: an informer that relists
					// never learns of it.
					excused = slices.ContainsFunc(tombstones[name], func(e cmChange) bool { return e.At.After(ops[i-1].At) })
					if !excused {
						born := i - 1
						for born > 0 && ops[born].Type != "ADDED" {
							born--
						}
						unseen := !slices.ContainsFunc(ops[born:i], func(c cmChange) bool { return len(seen[changeKey(c)]) > 0 })
						excused = unseen && skippedByRelist(ops[born].At, w.At)
					}
				case !next.IsZero():
					excused = skippedByRelist(w.At, next)
				}
				a.lost++
				if excused {
					a.excused++
				} else {
					var tombs []string
					for _, e := range tombstones[name] {
						tombs = append(tombs, e.At.Format("15:04:05.000"))
					}
					a.problem("lost: %v (%s, written at %s; tombstones for it at %v)", w, w.Seq, w.At.Format("15:04:05.000"), tombs)
				}
			case len(evs) > 1:
				a.dups += len(evs) - 1
				a.problem("duplicated: %v seen %d times (first at %s, again at %s)", w, len(evs),
					evs[0].At.Format("15:04:05.000"), evs[1].At.Format("15:04:05.000"))
			}
			if len(evs) > 0 && evs[0].Type != w.Type && !inRelist(evs[0].At) {
				a.wrongType++
				a.problem("%v seen as %s", w, evs[0].Type)
			}
		}
	}
	for k, evs := range seen {
		if !known[k] {
			a.unknown += len(evs)
			a.problem("unexpected: %v matches no change the writer made", evs[0])
		}
	}
	return a
}

// ---- the report ----

// report renders the table per bucket and the totals.
func (s *soak) report(audits []soakAudit) string {
	s.mu.Lock()
	samples := slices.Clone(s.samples)
	schedule := slices.Clone(s.log)
	missed := s.missedScrapes
	s.mu.Unlock()
	var b strings.Builder
	var kinds []string
	for _, f := range soakFaults {
		kinds = append(kinds, fmt.Sprintf("%s×%d", f.name, s.kinds[f.name]))
	}
	fmt.Fprintf(&b, "soak report: %v of faults (%v with the finish); faults run: %s\n", s.faultPhase(samples).Round(time.Second),
		time.Since(s.start).Round(time.Second), strings.Join(kinds, " "))
	fmt.Fprintf(&b, "%-9s %-44s %9s %6s %7s %5s %7s %8s %7s", "t", "faults", "up req/s", "cpu%", "rss MB", "gor", "resumes", "rewatch", "relist")
	if s.share {
		fmt.Fprintf(&b, " %5s %5s %5s", "feeds", "subs", "joins")
	}
	b.WriteString("\n")
	for _, row := range bucketize(samples) {
		fmt.Fprintf(&b, "%-9s %-44s %9.1f %6.1f %7.1f %5.0f %7.0f %8d %7d", row.span, row.faults, row.reqPerSec,
			row.cpuPct, row.rssMB, row.goroutines, row.resumes, row.rewatches, row.relists)
		if s.share {
			fmt.Fprintf(&b, " %5.0f %5.0f %5.0f", row.feeds, row.subscribers, row.joins)
		}
		b.WriteString("\n")
	}
	tot := summarize(samples)
	fmt.Fprintf(&b, "upstream requests: %d (%.1f/s mean, %.1f/s peak bucket); watchsan CPU: %.1f%% mean, %.1f%% peak bucket; RSS MB: %.1f first, %.1f peak, %.1f last; goroutines: %.0f first, %.0f peak, %.0f last\n",
		tot.requests, tot.meanReq, tot.peakReq, tot.meanCPU, tot.peakCPU, tot.firstRSS, tot.peakRSS, tot.lastRSS, tot.firstGor, tot.peakGor, tot.lastGor)
	fmt.Fprintf(&b, "events written: %d; watchsan: %s; metrics scrapes missed: %d\n", s.wr.count(), resumeSummary(s.p), missed)
	fmt.Fprintf(&b, "watchsan stream ends: %s; retries: %s; warnings and errors in its log: %s\n", s.metricByLabel("watchsan_watch_stream_ends_total", "reason",
		"upstream-ended", "client-gone", "client-deadline", "shutdown", "upstream-malformed", "resume-timeout", "resume-refused",
		"relist-forced", "upstream-broke", "upstream-error-event"),
		s.metricByLabel("watchsan_request_retries_total", "outcome", "retried", "recovered", "exhausted"), logWarnings(s.p))
	if s.share {
		sh := s.shareTotals()
		fmt.Fprintf(&b, "shared feeds: %.0f joins; %.0f feeds and %.0f subscribers at the peak; private feeds: %s; ring evictions %v, slow subscribers %v; watch requests: %d from the informers, %d reaching the apiservers\n",
			sh.joins, sh.peakFeeds, sh.peakSubscribers, s.metricByLabel("watchsan_watch_private_feeds_total", "reason", watch.PrivateFeedReasons...),
			s.p.Metric("watchsan_shared_feed_ring_evictions_total", nil), s.p.Metric("watchsan_shared_feed_slow_subscribers_total", nil),
			sh.clientWatch, sh.upstreamWatches)
	}
	fmt.Fprintf(&b, "%-11s %6s %6s %5s %10s %5s %8s %8s %8s %9s %7s\n", "informer", "seen", "lost", "dup", "regressing", "unexp", "excused", "resyncs", "tombst", "re-watches", "relists")
	for i, a := range audits {
		w := s.infs[i]
		fmt.Fprintf(&b, "%-11s %6d %6d %5d %10d %5d %8d %8d %8d %9d %7d\n", w.name, a.seen, a.lost-a.excused, a.dups,
			a.regress+a.reorder, a.unknown, a.excused, a.resyncs, a.tombstones, w.req.rewatches.Load(), w.relists())
	}
	s.compactReport(&b, s.secAudits)
	fmt.Fprintf(&b, "schedule:\n  %s\n", strings.Join(schedule, "\n  "))
	return b.String()
}

// metricByLabel renders the non-zero values of metric name for each value of label, e.g.
// "client-deadline=3 resume-timeout=1"; "none" when all are zero.
func (s *soak) metricByLabel(name, label string, values ...string) string {
	var parts []string
	for _, v := range values {
		if n := s.p.Metric(name, map[string]string{label: v}); n != 0 {
			parts = append(parts, fmt.Sprintf("%s=%v", v, n))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// logWarnings counts watchsan's log lines at warn level and above by message, e.g.
// `"upstream unhealthy"×12`; "none" when there is none.
func logWarnings(p *proxy) string {
	counts := map[string]int{}
	for _, line := range strings.Split(p.Log(), "\n") {
		var m struct{ Level, Msg string }
		if json.Unmarshal([]byte(line), &m) != nil || m.Level == "debug" || m.Level == "info" || m.Level == "" {
			continue
		}
		counts[m.Level+": "+m.Msg]++
	}
	if len(counts) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		parts = append(parts, fmt.Sprintf("%q×%d", k, counts[k]))
	}
	return strings.Join(parts, ", ")
}

func (s *soak) faultPhase(samples []soakSample) time.Duration {
	for _, smp := range samples {
		if smp.Fault == "finish" {
			return smp.At
		}
	}
	return time.Since(s.start)
}

type soakRow struct {
	span               string
	faults             string
	reqPerSec, cpuPct  float64
	rssMB, goroutines  float64
	resumes            float64
	rewatches, relists int64
	// shared feeds: open and subscribers at the row's end, joins in it
	feeds, subscribers, joins float64
	end                       time.Duration
}

// bucketize groups samples into soakBucket rows by the time they were taken: rates over the
// row (from the last sample of the row before), the RSS and goroutines at its end, counts of
// what happened in it.
func bucketize(samples []soakSample) []soakRow {
	var rows []soakRow
	if len(samples) < 2 {
		return rows
	}
	from := samples[0]
	for i := 1; i < len(samples); {
		k := samples[i].At / soakBucket
		var faultsSeen []string
		last := from
		for ; i < len(samples) && samples[i].At/soakBucket == k; i++ {
			smp := samples[i]
			if !slices.Contains(faultsSeen, smp.Fault) && smp.Fault != "none" {
				faultsSeen = append(faultsSeen, smp.Fault)
			}
			last = smp
		}
		wall := (last.At - from.At).Seconds()
		if wall <= 0 {
			continue
		}
		f := strings.Join(faultsSeen, ",")
		if f == "" {
			f = "-"
		}
		rows = append(rows, soakRow{
			span:        fmt.Sprintf("%.0f-%.0fs", (k * soakBucket).Seconds(), min((k+1)*soakBucket, last.At).Seconds()),
			faults:      f,
			reqPerSec:   float64(last.Requests-from.Requests) / wall,
			cpuPct:      100 * (last.CPU - from.CPU).Seconds() / wall,
			rssMB:       last.RSSMB,
			goroutines:  last.Goroutines,
			resumes:     last.Resumes - from.Resumes,
			rewatches:   last.Rewatches - from.Rewatches,
			relists:     last.Relists - from.Relists,
			feeds:       last.SharedFeeds,
			subscribers: last.Subscribers,
			joins:       last.Joins - from.Joins,
			end:         last.At,
		})
		from = last
	}
	return rows
}

type soakTotals struct {
	requests                   int64
	meanReq, peakReq           float64
	meanCPU, peakCPU           float64
	firstRSS, peakRSS, lastRSS float64
	firstGor, peakGor, lastGor float64
}

func summarize(samples []soakSample) soakTotals {
	var t soakTotals
	rows := bucketize(samples)
	if len(rows) == 0 {
		return t
	}
	first, last := samples[0], samples[len(samples)-1]
	wall := (last.At - first.At).Seconds()
	t.requests = last.Requests - first.Requests
	t.meanReq = float64(t.requests) / wall
	t.meanCPU = 100 * (last.CPU - first.CPU).Seconds() / wall
	t.firstRSS, t.lastRSS = rows[0].rssMB, last.RSSMB
	t.firstGor, t.lastGor = rows[0].goroutines, last.Goroutines
	for _, r := range rows {
		t.peakReq = max(t.peakReq, r.reqPerSec)
		t.peakCPU = max(t.peakCPU, r.cpuPct)
	}
	for _, smp := range samples {
		t.peakRSS = max(t.peakRSS, smp.RSSMB)
		t.peakGor = max(t.peakGor, smp.Goroutines)
	}
	return t
}

// checkBounds fails on an upstream request storm and on RSS growth (see soakMaxReqPerSec and
// soakRSSFactor for the bounds and why).
func (s *soak) checkBounds() {
	s.mu.Lock()
	samples := slices.Clone(s.samples)
	s.mu.Unlock()
	rows := bucketize(samples)
	if len(rows) == 0 {
		s.t.Errorf("no samples")
		return
	}
	for _, r := range rows {
		if r.reqPerSec > soakMaxReqPerSec {
			s.t.Errorf("upstream request storm: %.1f requests/s in %s (%s), bound %d/s", r.reqPerSec, r.span, r.faults, soakMaxReqPerSec)
		}
	}
	base := rows[0].rssMB
	bound := max(soakRSSFactor*base, base+soakRSSSlackMB)
	for _, smp := range samples {
		if smp.At > rows[0].end && smp.RSSMB > bound {
			s.t.Errorf("watchsan's RSS grew to %.1f MB at %v (after the first bucket %.1f MB; bound %.1f MB)", smp.RSSMB,
				smp.At.Round(time.Second), base, bound)
			break
		}
	}
	if s.stuck {
		s.t.Errorf("the schedule stopped early: a recovery timed out")
	}
}

// soakMaxEndedWatchesPerSec bounds how often watchsan may reopen one client's watch while every
// upstream ends watches at once: a resume loop that backs off (even 50 ms doubling) stays far
// below; one that does not reaches hundreds per second on loopback.
const soakMaxEndedWatchesPerSec = 10

// TestSoakImmediateEndsEverywhere is what the soak's schedule never does: every upstream ends
// every watch at once (200, then a clean end before any event; an L7 hop with a broken stream
// timeout, or an apiserver shedding watches), for a few seconds. watchsan must keep the client's
// stream without losing anything, and must not hammer the upstreams meanwhile.
func TestSoakImmediateEndsEverywhere(t *testing.T) {
	c := newCluster(t, cluster.Options{})
	ns := resilienceNamespace(t, c, "ends-everywhere")
	front := newFaultedAPIServer(t, c, 0)
	p := startProxy(t, append([]string{"--upstream=" + front.URL, "--upstream-ca-file=" + front.CAFile}, resilienceFlags...)...)
	w := startCountingInformer(t, "watchsan", resilienceClientConfig(c, p), ns)
	wr := newRecordingWriter(t, c, ns)
	wr.start(4, 50*time.Millisecond)
	eventually(t, 30*time.Second, "the writer to get going", func() bool { return wr.count() >= 10 })

	const d = 3 * time.Second
	before := front.layer.Stats()
	cpu0, _ := procCPU(p.cmd.Process.Pid)
	front.set(t, faults.Faults{EndImmediately: true})
	time.Sleep(d)
	front.set(t, faults.Faults{})
	cpu1, _ := procCPU(p.cmd.Process.Pid)
	after := front.layer.Stats()
	rate := float64(after.Watches-before.Watches) / d.Seconds()
	t.Logf("for %v every watch ended at once: %d watch requests upstream (%.0f/s), %d ended at once, watchsan CPU %.0f%%; %s",
		d, after.Watches-before.Watches, rate, after.EndedImmediately-before.EndedImmediately,
		100*(cpu1-cpu0).Seconds()/d.Seconds(), resumeSummary(p))

	finishAndCompare(t, wr, []*countingInformer{w}, nil)
	w.requireUndisturbed(t)
	t.Logf("%s", w.counts())
	if rate > soakMaxEndedWatchesPerSec {
		// Resumes that deliver nothing back off; before, watchsan reopened the watch
		// about 650 times a second here.
		t.Errorf("watchsan reopened the watch %.0f times a second while every upstream ended it at once (bound %d/s)",
			rate, soakMaxEndedWatchesPerSec)
	}
}

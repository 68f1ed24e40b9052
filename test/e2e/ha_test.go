package e2e

// watchsan as the HA frontend of three real apiservers sharing one etcd, with its
// default detection settings: one apiserver after another is frozen (SIGSTOP), killed and
// restarted, cut off etcd (its watch cache stops advancing while it keeps serving), and
// removed from the configuration by a live reload and added back, while informers watch
// through watchsan and a writer changes objects directly on an apiserver that is up. Each
// phase first checks where the watches are (watchsan's per-upstream open watches), so that a
// break provably hits some, then measures how long events took to reach the informers while
// the watches moved, and waits until the watches are spread evenly again. At the end every
// informer must have seen one unbroken stream: no relist, no re-watch, no error, every change
// once and in order.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/watchsan/watchsan/test/cluster"
)

// haFreezeBound bounds the worst delay of an event while the apiserver serving its watch is
// frozen, with the default settings: a ping interval and 1.5 ping timeouts (2.5 s) to find it
// (docs/design.md section 10.9), plus the resume, plus slack for -race on a busy 2-core machine.
const haFreezeBound = 4 * time.Second

// haEnv is one watchsan in front of a cluster's apiservers, configured through a file that the
// test rewrites (live membership), with informers through it and a writer.
type haEnv struct {
	c       *cluster.Cluster
	p       *proxy
	cfgFile string
	ns      string
	via     []*countingInformer
	wr      *recordingWriter
	breaks  int
}

// writeConfig writes watchsan's configuration file with apiservers members as upstreams.
func (e *haEnv) writeConfig(t *testing.T, members ...int) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "upstream-ca-file: %s\nupstream:\n", e.c.CAFile)
	for _, i := range members {
		fmt.Fprintf(&b, "  - %s\n", e.c.APIServers[i].URL)
	}
	tmp := e.cfgFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, e.cfgFile); err != nil { // as a ConfigMap volume swaps its files
		t.Fatal(err)
	}
}

// watchesOn returns watchsan's open watches on apiserver i.
func (e *haEnv) watchesOn(i int) float64 {
	return e.p.Metric("watchsan_upstream_open_watches", map[string]string{"upstream": e.c.APIServers[i].URL})
}

// known reports whether watchsan has apiserver i among its upstreams (draining included).
func (e *haEnv) known(i int) bool {
	return e.p.Metric("watchsan_upstream_state", map[string]string{"upstream": e.c.APIServers[i].URL}) > 0
}

// distribution is the open watches per apiserver, e.g. "0:2 1:2 2:2".
func (e *haEnv) distribution() string {
	var parts []string
	for i := range e.c.APIServers {
		parts = append(parts, fmt.Sprintf("%d:%v", i, e.watchesOn(i)))
	}
	return strings.Join(parts, " ")
}

// waitEven waits until the watches are spread over members evenly (counts differing by at
// most one, none elsewhere) and returns how long that took.
func (e *haEnv) waitEven(t *testing.T, timeout time.Duration, members ...int) time.Duration {
	t.Helper()
	start := time.Now()
	want := float64(len(e.via))
	eventually(t, timeout, "the watches to even out over "+fmt.Sprint(members)+" (now "+e.distribution()+")", func() bool {
		var sum, lo, hi float64 = 0, want, 0
		for i := range e.c.APIServers {
			n := e.watchesOn(i)
			sum += n
			if slices.Contains(members, i) {
				lo, hi = min(lo, n), max(hi, n)
			} else if n != 0 {
				return false
			}
		}
		return sum == want && hi-lo <= 1
	})
	return time.Since(start)
}

// worstDelay is the longest time from a change the writer made (its answer) to an informer's
// handler getting it, over the changes answered in [from, to].
func worstDelay(wr *recordingWriter, informers []*countingInformer, from, to time.Time) (worst time.Duration, n int) {
	wr.mu.Lock()
	written := map[string]time.Time{}
	for name, ops := range wr.ops {
		for _, o := range ops {
			if o.RV != "" && !o.At.Before(from) && !o.At.After(to) {
				written[name+"@"+o.RV] = o.At
			}
		}
	}
	wr.mu.Unlock()
	for _, w := range informers {
		for _, ev := range w.history() {
			if at, ok := written[ev.Name+"@"+ev.RV]; ok {
				worst = max(worst, ev.At.Sub(at))
				n++
			}
		}
	}
	return worst, n
}

// haPhase is one break of one apiserver and what it did.
type haPhase struct {
	what                  string
	before, during, after string
	allMovedAfter         time.Duration // from the break until no watch was left on it
	worst                 time.Duration // the worst event delay over the break
	events                int
	evenAfter             time.Duration // from the apiserver's return until even again
	held                  float64       // watches on it before the break
	left                  string        // how they left: its resumes by reason
	leftN                 float64
}

func (ph haPhase) String() string {
	return fmt.Sprintf("ha: %-18s watches before [%s] during [%s] after [%s]; all %v off it %v after the break (%s); worst event delay %v (%d deliveries); even again %v after its return",
		ph.what, ph.before, ph.during, ph.after, ph.held, ph.allMovedAfter.Round(10*time.Millisecond), ph.left, ph.worst.Round(10*time.Millisecond), ph.events,
		ph.evenAfter.Round(100*time.Millisecond))
}

// breakAndHeal breaks apiserver i with brk (the writer stays off it), waits until its watches
// have all moved and a change made after the break reached every informer, measures, heals
// it, and waits until the watches are even again over all apiservers.
func (e *haEnv) breakAndHeal(t *testing.T, what string, i int, brk, heal func(), all ...int) haPhase {
	t.Helper()
	if len(all) == 0 {
		all = []int{0, 1, 2}
	}
	ph := haPhase{what: what, before: e.distribution(), held: e.watchesOn(i)}
	if ph.held < 1 {
		t.Fatalf("%s: apiserver-%d holds no watch [%s]: the break would test nothing", what, i, ph.before)
	}
	u := e.c.APIServers[i].URL
	resumes := func() map[string]float64 {
		out := map[string]float64{}
		for _, r := range []string{"eof", "reset", "truncated", "stall", "moved"} {
			out[r] = e.p.Metric("watchsan_upstream_watch_resumes_total", map[string]string{"upstream": u, "reason": r})
		}
		for _, r := range []string{"unhealthy", "degraded", "removed", "rebalance", "lagging"} {
			out["moved:"+r] = e.p.Metric("watchsan_upstream_watch_moves_total", map[string]string{"upstream": u, "reason": r})
		}
		return out
	}
	was := resumes()
	e.wr.avoid(i)
	at := time.Now()
	brk()
	eventually(t, 20*time.Second, fmt.Sprintf("%s: every watch off apiserver-%d (now %s)", what, i, e.distribution()), func() bool {
		return e.watchesOn(i) == 0
	})
	ph.allMovedAfter = time.Since(at)
	var left []string
	for k, v := range resumes() {
		if d := v - was[k]; d > 0 {
			left = append(left, fmt.Sprintf("%s %v", k, d))
			if !strings.HasPrefix(k, "moved:") {
				ph.leftN += d
			}
		}
	}
	slices.Sort(left)
	ph.left = strings.Join(left, ", ")
	if ph.leftN < ph.held {
		t.Errorf("%s: %v watches were on apiserver-%d, but only %v resumes of watches that broke on it were counted (%s)", what, ph.held, i, ph.leftN, ph.left)
	}
	m := e.wr.marker(fmt.Sprintf("after-break-%d-of-apiserver-%d", e.breaks, i))
	e.breaks++
	var seen time.Time
	for _, w := range e.via {
		seen = w.waitSeen(t, m, 30*time.Second)
	}
	ph.during = e.distribution()
	ph.worst, ph.events = worstDelay(e.wr, e.via, at.Add(-500*time.Millisecond), seen)
	heal()
	backAt := time.Now()
	waitUpstreamUp(t, e.p, e.c.APIServers[i].URL)
	e.wr.allow(i)
	e.waitEven(t, 60*time.Second, all...)
	ph.evenAfter = time.Since(backAt)
	ph.after = e.distribution()
	t.Log(ph)
	return ph
}

// TestHAFrontend: three apiservers on one etcd behind one watchsan with default settings;
// each apiserver in turn frozen, killed, cut off etcd, removed by a reload and added back.
func TestHAFrontend(t *testing.T) {
	c := newCluster(t, cluster.Options{APIServers: 3, EtcdProxy: true})
	e := &haEnv{c: c, ns: resilienceNamespace(t, c, "ha"), cfgFile: filepath.Join(t.TempDir(), "watchsan.yaml")}
	e.writeConfig(t, 0, 1, 2)
	e.p = startProxy(t, "--config="+e.cfgFile, "--log-level=info")
	for i := range c.APIServers {
		waitUpstreamUp(t, e.p, c.APIServers[i].URL)
	}
	for i := range 6 {
		e.via = append(e.via, startCountingInformer(t, fmt.Sprintf("watchsan#%d", i+1), resilienceClientConfig(c, e.p), e.ns))
	}
	e.wr = newRecordingWriter(t, c, e.ns)
	e.wr.start(8, 30*time.Millisecond)
	eventually(t, 30*time.Second, "the writer to get going", func() bool { return e.wr.count() >= 20 })
	took := e.waitEven(t, 30*time.Second, 0, 1, 2)
	t.Logf("ha: six informers' watches spread [%s] (%v after the last one started)", e.distribution(), took.Round(100*time.Millisecond))
	// Many watches share few HTTP/2 connections: per upstream, one for requests and watches (a
	// race at the first requests may add one); the health checker's are its own.
	for i := range c.APIServers {
		if n := e.p.Metric("watchsan_upstream_dials_total", map[string]string{"upstream": c.APIServers[i].URL, "connection": "requests", "result": "ok"}); n > 2 {
			t.Errorf("watchsan opened %v connections to apiserver-%d for %v watches and their lists, want at most 2", n, i, e.watchesOn(i))
		}
	}

	var phases []haPhase
	// Frozen: nothing answers, connections stay open (kubernetes#65012).
	frozen := e.breakAndHeal(t, "frozen (SIGSTOP)", 0, func() {
		if err := c.APIServers[0].Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.APIServers[0].Signal(syscall.SIGCONT) })
	}, func() {
		if err := c.APIServers[0].Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	})
	phases = append(phases, frozen)
	// Killed: connections reset, the port refuses; restarted on the same port.
	killed := e.breakAndHeal(t, "killed (SIGKILL)", 1, func() {
		if err := c.APIServers[1].Kill(); err != nil {
			t.Fatal(err)
		}
	}, func() {
		if err := c.APIServers[1].Restart(ctxT(t, 2*time.Minute)); err != nil {
			t.Fatal(err)
		}
	})
	phases = append(phases, killed)
	// Cut off etcd: it keeps serving from a watch cache that no longer advances.
	phases = append(phases, e.breakAndHeal(t, "etcd paused", 2, func() {
		if err := c.APIServers[2].PauseEtcd(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.APIServers[2].ResumeEtcd() })
	}, func() {
		if err := c.APIServers[2].ResumeEtcd(); err != nil {
			t.Fatal(err)
		}
	}))
	// Removed by a live reload (SIGHUP), then added back by changing the file alone.
	phases = append(phases, e.breakAndHeal(t, "removed by reload", 0, func() {
		e.writeConfig(t, 1, 2)
		if err := e.p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}, func() {
		if !e.known(0) {
			t.Fatal("the removed upstream was forgotten at once: its last counts could not be scraped")
		}
		e.writeConfig(t, 0, 1, 2) // no signal: the file's change is noticed
	}))

	finishAndCompare(t, e.wr, e.via, nil)
	for _, w := range e.via {
		w.requireUndisturbed(t)
	}
	requireWatching(t, e.p, len(e.via))
	for _, ph := range phases {
		t.Log(ph)
	}
	t.Logf("ha: rebalancing moved %v watches in all; %s",
		e.p.Metric("watchsan_upstream_watch_moves_total", map[string]string{"reason": "rebalance"}), resumeSummary(e.p))
	for i := range c.APIServers {
		n := e.p.Metric("watchsan_upstream_detection_seconds_count", map[string]string{"upstream": c.APIServers[i].URL})
		if n > 0 {
			s := e.p.Metric("watchsan_upstream_detection_seconds_sum", map[string]string{"upstream": c.APIServers[i].URL})
			t.Logf("ha: apiserver-%d: %v detections (unhealthy or lagging), mean %.2fs from its last sign of life", i, n, s/n)
		}
	}
	if frozen.worst > haFreezeBound {
		t.Errorf("an event took %v to reach an informer while its apiserver was frozen, want at most %v with the default settings", frozen.worst, haFreezeBound)
	}
	if killed.worst > haFreezeBound {
		t.Errorf("an event took %v to reach an informer after its apiserver was killed, want at most %v", killed.worst, haFreezeBound)
	}
	if !strings.Contains(phases[3].left, "moved:removed") {
		t.Errorf("no watch moved off the removed apiserver as removed (%s)", phases[3].left)
	}
	if n := e.p.Metric("watchsan_watch_relists_forced_total", nil); n != 0 {
		t.Errorf("watchsan told %v clients to relist, want 0", n)
	}
}

// TestHATimeTravelGuard: an apiserver cut off etcd keeps answering lists at
// resourceVersion=0 from its stale watch cache (kubernetes#59848). Through a watchsan without
// the guard some lists sent right after the cut come back older than what its informer has
// already seen; through one with the guard (the default) none does: they are sent at the
// high-water mark with resourceVersionMatch=NotOlderThan, the lagging apiserver answers 504,
// and another one serves them.
func TestHATimeTravelGuard(t *testing.T) {
	c := newCluster(t, cluster.Options{APIServers: 3, EtcdProxy: true})
	ns := resilienceNamespace(t, c, "timetravel")
	args := resilienceProxyArgs(c, 0, 1, 2)
	guarded := startProxy(t, args...)
	unguarded := startProxy(t, append(args, "--time-travel-guard=false")...)
	proxies := map[string]*proxy{"guarded": guarded, "unguarded": unguarded}
	for _, p := range proxies {
		for i := range c.APIServers {
			waitUpstreamUp(t, p, c.APIServers[i].URL)
		}
	}
	informers := map[string]*countingInformer{
		"guarded":   startCountingInformer(t, "guarded", resilienceClientConfig(c, guarded), ns),
		"unguarded": startCountingInformer(t, "unguarded", resilienceClientConfig(c, unguarded), ns),
	}
	// The apiserver to cut off holds neither watch: both informers keep getting events, so
	// both watchsans know the newest resourceVersion.
	lag := -1
	for i := range c.APIServers {
		on := 0.0
		for _, p := range proxies {
			on += p.Metric("watchsan_upstream_open_watches", map[string]string{"upstream": c.APIServers[i].URL})
		}
		if on == 0 {
			lag = i
			break
		}
	}
	if lag < 0 {
		t.Fatal("every apiserver holds a watch of the two watchsans: with two watches that cannot be")
	}
	wr := newRecordingWriter(t, c, ns)
	wr.marker("before-the-cut")
	wr.avoid(lag)
	if err := c.APIServers[lag].PauseEtcd(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.APIServers[lag].ResumeEtcd() })
	cut := time.Now()
	m := wr.markerObject("after-the-cut")
	for _, w := range informers {
		w.waitSeen(t, m.Name, 10*time.Second)
	}
	want := m.ResourceVersion
	listRV := func(p *proxy) (string, bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cs, err := kubernetes.NewForConfig(resilienceClientConfig(c, p))
		if err != nil {
			return "", false, err
		}
		l, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return "", false, err
		}
		has := false
		for _, cm := range l.Items {
			has = has || cm.Name == m.Name
		}
		return l.ResourceVersion, has, nil
	}
	stale := map[string]int{}
	lists := map[string]int{}
	var slowest time.Duration
	// The unguarded burst first: it must reach the lagging apiserver before watchsan holds it
	// back (its /readyz fails 3-4 s after the cut).
	for _, name := range []string{"unguarded", "guarded"} {
		for k := 0; k < 30; k++ {
			start := time.Now()
			rv, has, err := listRV(proxies[name])
			if err != nil {
				t.Fatalf("%s: list at resourceVersion=0: %v", name, err)
			}
			if name == "guarded" {
				slowest = max(slowest, time.Since(start))
			}
			lists[name]++
			if !has || olderRV(rv, want) {
				stale[name]++
			}
		}
	}
	sinceCut := time.Since(cut)
	t.Logf("timetravel: apiserver-%d cut off etcd; within %v after the cut, lists at resourceVersion=0 older than the informer's newest (%s): unguarded %d of %d, guarded %d of %d (slowest guarded list %v)",
		lag, sinceCut.Round(time.Millisecond), want, stale["unguarded"], lists["unguarded"], stale["guarded"], lists["guarded"], slowest.Round(time.Millisecond))
	t.Logf("timetravel: guarded watchsan: lists raised %v (all upstreams behind: %v), retries %v, apiserver-%d lagging %v",
		guarded.Metric("watchsan_list_rv_raised_total", map[string]string{"outcome": "sent"}),
		guarded.Metric("watchsan_list_rv_raised_total", map[string]string{"outcome": "too-large"}),
		guarded.Metric("watchsan_request_retries_total", map[string]string{"outcome": "recovered"}), lag,
		guarded.Metric("watchsan_upstream_lagging", map[string]string{"upstream": c.APIServers[lag].URL}))
	if stale["guarded"] != 0 {
		t.Errorf("the guarded watchsan answered %d lists older than what its informer had seen", stale["guarded"])
	}
	if stale["unguarded"] == 0 {
		t.Errorf("the unguarded watchsan answered no stale list: the scenario did not exercise the lagging apiserver")
	}
	eventually(t, 5*time.Second, "the guard to count every list it raised", func() bool {
		return guarded.Metric("watchsan_list_rv_raised_total", map[string]string{"outcome": "sent"}) >= float64(lists["guarded"])
	})
	guarded.requireProxied(float64(lists["guarded"]), map[string]string{"verb": "list"})
	unguarded.requireProxied(float64(lists["unguarded"]), map[string]string{"verb": "list"})
}

// olderRV reports whether resourceVersion a is below b (both decimal).
func olderRV(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

// TestHADiscovery: with --upstream-discovery=endpoints watchsan follows the EndpointSlices of
// the default/kubernetes Service, starting from one --upstream, as a node-local proxy does.
// Three apiservers listen on 127.0.0.1, 127.0.0.2 and 127.0.0.3, one port; the test edits the
// slice (as the apiservers' endpoint reconciler would) and watchsan adds and drains upstreams
// while informers watch through it undisturbed.
func TestHADiscovery(t *testing.T) {
	c := newCluster(t, cluster.Options{APIServers: 3, BindAddresses: []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"}})
	ns := resilienceNamespace(t, c, "discovery")
	cs, err := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	port := int32(c.APIServers[0].Port)
	// The apiservers cannot publish themselves: validation refuses loopback addresses in
	// Endpoints and EndpointSlices ("may not be in the loopback range"), so the test writes the
	// slice their endpoint reconciler would write straight into etcd (JSON, which the
	// apiserver's storage decoder reads beside protobuf) and the apiservers' watch caches pick
	// it up from there.
	created := time.Now().UTC().Format(time.RFC3339)
	setSlice := func(members ...int) {
		t.Helper()
		var eps []map[string]any
		for _, i := range members {
			eps = append(eps, map[string]any{"addresses": []string{c.APIServers[i].Address}, "conditions": map[string]any{"ready": true}})
		}
		obj := map[string]any{
			"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
			"metadata": map[string]any{"name": "kubernetes", "namespace": "default", "uid": "9a5e0d2c-1111-4222-8333-444455556666",
				"creationTimestamp": created,
				"labels":            map[string]string{"kubernetes.io/service-name": "kubernetes"}}, // the reconciler sets no managed-by
			"addressType": "IPv4",
			"endpoints":   eps,
			"ports":       []map[string]any{{"name": "https", "port": port, "protocol": "TCP"}},
		}
		value, _ := json.Marshal(obj)
		body, _ := json.Marshal(map[string]string{
			"key":   base64.StdEncoding.EncodeToString([]byte("/registry/endpointslices/default/kubernetes")),
			"value": base64.StdEncoding.EncodeToString(value),
		})
		resp, err := http.Post(c.EtcdURL+"/v3/kv/put", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatalf("etcd put: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("etcd put: %s", resp.Status)
		}
		// Seen by the apiservers once a list through them names the members.
		eventually(t, 10*time.Second, "the apiservers to serve the new slice", func() bool {
			ctx := ctxT(t, 5*time.Second)
			got, err := cs.DiscoveryV1().EndpointSlices("default").Get(ctx, "kubernetes", metav1.GetOptions{})
			return err == nil && len(got.Endpoints) == len(members)
		})
	}
	setSlice(0, 1)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, "--upstream="+c.APIServers[0].URL, "--upstream-ca-file="+c.CAFile, "--kubeconfig="+kubeconfig,
		"--upstream-discovery=endpoints", "--upstream-discovery-interval=500ms", "--log-level=info")
	e := &haEnv{c: c, p: p, ns: ns}
	eventually(t, 30*time.Second, "watchsan to discover apiservers 0 and 1", func() bool { return e.known(0) && e.known(1) && !e.known(2) })
	for i := range 4 {
		e.via = append(e.via, startCountingInformer(t, fmt.Sprintf("watchsan#%d", i+1), resilienceClientConfig(c, p), ns))
	}
	e.wr = newRecordingWriter(t, c, ns)
	e.wr.start(6, 40*time.Millisecond)
	e.waitEven(t, 30*time.Second, 0, 1)
	t.Logf("discovery: apiservers 0 and 1 in the slice: watches [%s]", e.distribution())

	setSlice(0, 1, 2)
	eventually(t, 30*time.Second, "watchsan to discover apiserver 2 at "+c.APIServers[2].URL, func() bool { return e.known(2) })
	took := e.waitEven(t, 30*time.Second, 0, 1, 2)
	t.Logf("discovery: apiserver 2 added to the slice: watches [%s], even %v after it was known", e.distribution(), took.Round(100*time.Millisecond))

	setSlice(1, 2)
	took = e.waitEven(t, 30*time.Second, 1, 2)
	t.Logf("discovery: apiserver 0 (the seed) left the slice: watches [%s], drained in %v; moved off it as removed: %v", e.distribution(),
		took.Round(100*time.Millisecond), p.Metric("watchsan_upstream_watch_moves_total", map[string]string{"upstream": c.APIServers[0].URL, "reason": "removed"}))

	finishAndCompare(t, e.wr, e.via, nil)
	for _, w := range e.via {
		w.requireUndisturbed(t)
	}
	requireWatching(t, p, len(e.via))
}

// TestHAFreezeFoundByPings: the freeze of TestHAFrontend with lag detection off, so only the
// health checker's pings can find it (as in a quiet cluster, where no watch is behind any
// other): found and every watch moved within a health interval and 1.5 ping timeouts (2.5 s)
// plus slack.
func TestHAFreezeFoundByPings(t *testing.T) {
	c := newCluster(t, cluster.Options{APIServers: 2})
	e := &haEnv{c: c, ns: resilienceNamespace(t, c, "pings")}
	e.p = startProxy(t, "--upstream="+c.APIServers[0].URL, "--upstream="+c.APIServers[1].URL, "--upstream-ca-file="+c.CAFile,
		"--watch-lag-timeout=0", "--log-level=info")
	for i := range c.APIServers {
		waitUpstreamUp(t, e.p, c.APIServers[i].URL)
	}
	for i := range 4 {
		e.via = append(e.via, startCountingInformer(t, fmt.Sprintf("watchsan#%d", i+1), resilienceClientConfig(c, e.p), e.ns))
	}
	e.wr = newRecordingWriter(t, c, e.ns)
	e.wr.start(6, 30*time.Millisecond)
	e.waitEven(t, 30*time.Second, 0, 1)
	a := c.APIServers[0]
	ph := e.breakAndHeal(t, "frozen, pings only", 0, func() {
		if err := a.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Signal(syscall.SIGCONT) })
	}, func() {
		if err := a.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}, 0, 1)
	finishAndCompare(t, e.wr, e.via, nil)
	for _, w := range e.via {
		w.requireUndisturbed(t)
	}
	if !strings.Contains(ph.left, "moved:unhealthy") {
		t.Errorf("the watches left the frozen apiserver otherwise than as unhealthy: %s", ph.left)
	}
	if ph.worst > haFreezeBound {
		t.Errorf("an event took %v to reach an informer while its apiserver was frozen, want at most %v", ph.worst, haFreezeBound)
	}
	n := e.p.Metric("watchsan_upstream_detection_seconds_count", map[string]string{"upstream": a.URL, "what": "unhealthy"})
	s := e.p.Metric("watchsan_upstream_detection_seconds_sum", map[string]string{"upstream": a.URL, "what": "unhealthy"})
	if n < 1 {
		t.Fatal("no unhealthy verdict was measured")
	}
	t.Logf("ha: frozen apiserver found unhealthy by pings %.2fs after its last sign of life", s/n)
}

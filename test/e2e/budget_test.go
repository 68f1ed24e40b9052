package e2e

// Budget tests ("never the thing that breaks the cluster"): what watchsan costs its
// upstream and itself when things go wrong. Each test measures one cost over a window, logs the
// number (the before/after table comes from these lines, "budget:" prefixed) and fails
// past a bound:
//   - CPU and dials with the only upstream down and no client at all;
//   - upstream requests of one client watch whose upstream ends every watch at once;
//   - the time to a 503 when no upstream is usable;
//   - no panic when a client leaves, or watchsan stops, while a request waits to be retried;
//   - --shutdown-delay: readiness fails first, the listener keeps serving, then closes;
//   - health: unknown until probed, each transition logged once.
// None runs in parallel: they measure CPU and time on a shared machine.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/test/cluster"
)

// budgetInterval is the --health-interval of the budget tests.
const budgetInterval = time.Second

// budgetFlags are given to every budget test's watchsan: info logs (per-event debug lines
// would be part of the CPU measured) and a 1s health interval.
var budgetFlags = []string{"--log-level=info", "--health-interval=" + budgetInterval.String()}

// budgetProxy starts watchsan in front of upstream with budgetFlags, forwarding only what the
// client sends.
func budgetProxy(t *testing.T, upstream string, extra ...string) *proxy {
	t.Helper()
	args := append([]string{"--upstream=" + upstream, "--no-credentials"}, budgetFlags...)
	return startProxy(t, append(args, extra...)...)
}

// ---- what is measured ----

// cpuTime is the user+system CPU time process pid has used so far (all its threads).
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	d, err := procCPU(pid)
	if err != nil {
		t.Fatalf("reading watchsan's CPU time: %v", err)
	}
	return d
}

// cpuPercent measures watchsan's CPU use over window, in percent of one core.
func cpuPercent(t *testing.T, p *proxy, window time.Duration) float64 {
	t.Helper()
	pid := p.cmd.Process.Pid
	c0, t0 := cpuTime(t, pid), time.Now()
	time.Sleep(window) // the window is what is measured
	c1, wall := cpuTime(t, pid), time.Since(t0)
	return 100 * float64(c1-c0) / float64(wall)
}

// metricsText is watchsan's /metrics page.
func (p *proxy) metricsText() string {
	p.t.Helper()
	resp, err := http.Get(p.AdminURL + "/metrics")
	if err != nil {
		p.t.Fatalf("reading watchsan metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		p.t.Fatalf("reading watchsan metrics: %v", err)
	}
	return string(b)
}

// dialsMetric names the counter of every TCP dial watchsan makes to an upstream.
const dialsMetric = "watchsan_upstream_dials_total"

// dials returns watchsan's dials to its upstreams so far, and whether it exports the counter.
func dials(p *proxy) (float64, bool) {
	text := p.metricsText()
	return sumMetric(strings.NewReader(text), dialsMetric, nil), strings.Contains(text, "\n"+dialsMetric+"{")
}

// readyz returns the code of watchsan's admin /readyz (0: no answer).
func readyz(p *proxy) int {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(p.AdminURL + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// logCount counts watchsan's log lines with message msg from a logger whose name contains
// logger, among lines[from:].
func logCount(lines []string, from int, logger, msg string) int {
	n := 0
	for _, line := range lines[min(from, len(lines)):] {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg && strings.Contains(fmt.Sprint(m["logger"]), logger) {
			n++
		}
	}
	return n
}

func (p *proxy) logLines() []string { return strings.Split(p.Log(), "\n") }

// requireNoPanic fails if watchsan's log shows a panic (net/http's "http: panic serving" is
// the one a nil response from a RoundTripper makes) or a data race (the binary runs with -race).
func requireNoPanic(t *testing.T, p *proxy) {
	t.Helper()
	n := 0
	for _, line := range p.logLines() {
		if strings.Contains(strings.ToLower(line), "panic") || strings.Contains(line, "DATA RACE") {
			if n++; n <= 3 {
				t.Errorf("watchsan's log shows a panic or a race: %.300s", line)
			}
		}
	}
	if n > 0 {
		t.Logf("budget: %d log lines with a panic or a race", n)
	}
}

// answer is one whole response (or the error instead of one) and how long it took.
type answer struct {
	code   int
	header http.Header
	body   []byte
	took   time.Duration
	err    error
}

func (a answer) String() string {
	if a.err != nil {
		return fmt.Sprintf("no answer after %v: %v", a.took.Round(time.Millisecond), a.err)
	}
	return fmt.Sprintf("%d (Retry-After %q) after %v: %.200s", a.code, a.header.Get("Retry-After"), a.took.Round(time.Millisecond), a.body)
}

// fetch GETs url on a fresh connection within ctx and reads the whole answer.
func fetch(ctx context.Context, url string) answer {
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return answer{err: err}
	}
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		return answer{err: err, took: time.Since(start)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return answer{code: resp.StatusCode, header: resp.Header, body: body, err: err, took: time.Since(start)}
}

func fetchWithin(d time.Duration, url string) answer {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return fetch(ctx, url)
}

// status decodes a well-formed metav1.Status answer: JSON, kind Status, its code the HTTP code.
func (a answer) status() (*metav1.Status, error) {
	if a.err != nil {
		return nil, a.err
	}
	var st metav1.Status
	if err := json.Unmarshal(a.body, &st); err != nil {
		return nil, fmt.Errorf("body is not JSON: %v", err)
	}
	if st.Kind != "Status" || int(st.Code) != a.code || a.code < 400 {
		return nil, fmt.Errorf("not a failure Status matching the HTTP code")
	}
	return &st, nil
}

// require503 fails unless a is a 503 with a Retry-After of whole seconds and a Status body,
// answered within bound.
func require503(t *testing.T, what string, a answer, bound time.Duration) {
	t.Helper()
	t.Logf("budget: %s: %v", what, a)
	if a.err != nil {
		t.Errorf("%s: %v, want a 503 within %v", what, a, bound)
		return
	}
	if _, err := a.status(); err != nil || a.code != http.StatusServiceUnavailable {
		t.Errorf("%s: got %v, want a 503 Status (%v)", what, a, err)
	}
	if n, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || n < 1 {
		t.Errorf("%s: Retry-After %q, want whole seconds >= 1", what, a.header.Get("Retry-After"))
	}
	if a.took > bound {
		t.Errorf("%s: answered after %v, want within %v", what, a.took.Round(time.Millisecond), bound)
	}
}

// ---- upstreams of the tests' own ----

// fakeAPI is an upstream of the test's own on an address it keeps: /readyz answers 200 (after
// readyzDelay), every other request goes to serve. It counts watch and other requests.
type fakeAPI struct {
	t     *testing.T
	addr  string
	serve http.HandlerFunc

	readyzDelay    atomic.Int64 // a time.Duration; set while serving, hence atomic
	readyzAnswered atomic.Bool  // set before the first /readyz answer is written
	watches        atomic.Int64
	others         atomic.Int64

	mu  sync.Mutex
	srv *http.Server
}

func newFakeAPI(t *testing.T, serve http.HandlerFunc) *fakeAPI {
	t.Helper()
	f := &fakeAPI{t: t, serve: serve}
	t.Cleanup(f.stop)
	f.start()
	return f
}

func (f *fakeAPI) URL() string { return "http://" + f.addr }

// start serves (again) on the fake's address.
func (f *fakeAPI) start() {
	f.t.Helper()
	addr := f.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		f.t.Fatalf("fake upstream listen %s: %v", addr, err)
	}
	f.addr = ln.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(f.handle)}
	f.mu.Lock()
	f.srv = srv
	f.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
}

// stop closes the listener and every connection: from now on the address refuses.
func (f *fakeAPI) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.srv != nil {
		f.srv.Close()
		f.srv = nil
	}
}

func (f *fakeAPI) handle(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/readyz" {
		if d := time.Duration(f.readyzDelay.Load()); d > 0 {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return
			}
		}
		f.readyzAnswered.Store(true)
		_, _ = io.WriteString(w, "ok")
		return
	}
	if reqinfo.Parse(r).IsWatch() {
		f.watches.Add(1)
	} else {
		f.others.Add(1)
	}
	f.serve(w, r)
}

const namespaceList = `{"kind":"NamespaceList","apiVersion":"v1","metadata":{"resourceVersion":"5"},"items":[]}`

// listOrWatch answers a list with an empty NamespaceList and a watch with watch.
func listOrWatch(watch http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if reqinfo.Parse(r).IsWatch() {
			watch(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, namespaceList)
	}
}

// emptyWatch answers a watch 200 application/json and ends it at once, without an event.
func emptyWatch(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
}

// deadAddr is a loopback address with nothing listening.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// resetListener accepts TCP connections and resets each at once (SO_LINGER 0): an upstream
// that is there and is not. It counts the connections accepted.
func resetListener(t *testing.T) (addr string, accepts *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepts = new(atomic.Int64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepts.Add(1)
			_ = c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
	}()
	return ln.Addr().String(), accepts
}

// ---- a client's watch ----

// clientWatch is a JSON watch as a plain client holds one: it reads every event until the
// stream ends.
type clientWatch struct {
	mu     sync.Mutex
	events []string // event types
	ended  chan struct{}
	err    error     // how the stream ended (io.EOF: cleanly); read after ended
	endAt  time.Time // read after ended
}

// openWatch sends a watch through watchsan and, once it answered 200, reads it in the
// background. ctx ends it from the client's side.
func openWatch(t *testing.T, ctx context.Context, url string, header http.Header) *clientWatch {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("watch %s: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		resp.Body.Close()
		t.Fatalf("watch %s: %s %s", url, resp.Status, b)
	}
	cw := &clientWatch{ended: make(chan struct{})}
	go func() {
		defer close(cw.ended)
		defer resp.Body.Close()
		dec := json.NewDecoder(resp.Body)
		for {
			var ev struct{ Type string }
			if err := dec.Decode(&ev); err != nil {
				cw.err, cw.endAt = err, time.Now()
				return
			}
			cw.mu.Lock()
			cw.events = append(cw.events, ev.Type)
			cw.mu.Unlock()
		}
	}()
	return cw
}

func (cw *clientWatch) types() []string {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return append([]string(nil), cw.events...)
}

// earlyBy is how long before ctx's deadline the stream ended (after ended).
func (cw *clientWatch) earlyBy(ctx context.Context) time.Duration {
	d, _ := ctx.Deadline()
	return d.Sub(cw.endAt)
}

// endedBefore reports whether the stream ended by itself, before the client's deadline ctx
// ended it (after ended).
func (cw *clientWatch) endedBefore(ctx context.Context) bool {
	return cw.earlyBy(ctx) > 50*time.Millisecond
}

// done reports whether the stream has ended.
func (cw *clientWatch) done() bool {
	select {
	case <-cw.ended:
		return true
	default:
		return false
	}
}

// ---- 1. upstream down, no client ----

// TestBudgetUpstreamDownIdle: with its only upstream down and no client at all, watchsan uses
// almost no CPU and dials the upstream about once per health interval (the health check and
// at most one early re-check, backed off). Today's watchsan re-checks at once after every
// refused connection, forever.
func TestBudgetUpstreamDownIdle(t *testing.T) {
	const settle, window = 3 * time.Second, 6 * time.Second
	const maxCPU = 10.0 // percent of one core, for a -race binary that should be near 1%
	maxDials := float64(window/budgetInterval) + 3

	t.Run("refused", func(t *testing.T) {
		p := budgetProxy(t, "http://"+deadAddr(t))
		time.Sleep(settle) // past the first probes and the backoff's ramp
		d0, _ := dials(p)
		cpu := cpuPercent(t, p, window)
		d1, exported := dials(p)
		t.Logf("budget: upstream refusing, no client: CPU %.1f%% of one core over %v; %s %v (exported: %v)", cpu, window, dialsMetric, d1-d0, exported)
		if cpu > maxCPU {
			t.Errorf("watchsan used %.1f%% of one core over %v with its upstream down and no client, want at most %.0f%%", cpu, window, maxCPU)
		}
		if !exported {
			t.Fatalf("watchsan does not export %s (every TCP dial to an upstream, by result)", dialsMetric)
		}
		if d1-d0 > maxDials {
			t.Errorf("watchsan dialed its refusing upstream %v times in %v (health interval %v), want at most %v", d1-d0, window, budgetInterval, maxDials)
		}
	})

	t.Run("reset", func(t *testing.T) {
		addr, accepts := resetListener(t)
		p := budgetProxy(t, "http://"+addr)
		time.Sleep(settle)
		d0, _ := dials(p)
		a0 := accepts.Load()
		cpu := cpuPercent(t, p, window)
		n := accepts.Load() - a0
		d1, exported := dials(p)
		t.Logf("budget: upstream resetting every connection, no client: CPU %.1f%% of one core, %d connections (%.1f/s) over %v; %s %v (exported: %v)",
			cpu, n, float64(n)/window.Seconds(), window, dialsMetric, d1-d0, exported)
		if cpu > maxCPU {
			t.Errorf("watchsan used %.1f%% of one core over %v with its upstream resetting and no client, want at most %.0f%%", cpu, window, maxCPU)
		}
		if float64(n) > maxDials {
			t.Errorf("watchsan connected %d times in %v to an upstream that resets (health interval %v), want at most %v", n, window, budgetInterval, maxDials)
		}
		// The dial counter agrees with the connections the upstream saw (one may straddle
		// the window's edges). Its absence fails the "refused" case.
		if exported && (d1-d0 < float64(n)-1 || d1-d0 > float64(n)+1) {
			t.Errorf("%s rose by %v while the upstream accepted %d connections", dialsMetric, d1-d0, n)
		}
	})
}

// ---- 2. a watch whose upstream ends at once ----

// TestBudgetWatchUpstreamEndsAtOnce: one client watch whose upstream ends every watch right
// after its headers costs about one upstream request per second after the first few (a resume
// that delivers nothing is a failure, backed off), the client sees no error mid-stream, and
// after --watch-resume-timeout of such failures its stream ends cleanly.
func TestBudgetWatchUpstreamEndsAtOnce(t *testing.T) {
	const window = 10 * time.Second
	const maxRequests = 15 // per window: backoff from 800ms gives ~6

	watchPath := "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=5"

	t.Run("empty-body", func(t *testing.T) {
		f := newFakeAPI(t, listOrWatch(emptyWatch))
		p := budgetProxy(t, f.URL())
		eventually(t, 10*time.Second, "watchsan ready", func() bool { return readyz(p) == 200 })
		w0 := f.watches.Load()
		ctx, cancel := context.WithTimeout(context.Background(), window)
		defer cancel()
		cw := openWatch(t, ctx, p.URL+watchPath, nil)
		<-ctx.Done() // the window
		n := f.watches.Load() - w0
		<-cw.ended
		t.Logf("budget: one client watch, upstream answers every watch with an empty 200: %d upstream watch requests in %v; client saw %v, stream end %v",
			n, window, cw.types(), cw.err)
		if n > maxRequests {
			t.Errorf("one client watch cost %d upstream watch requests in %v, want at most %d", n, window, maxRequests)
		}
		if len(cw.types()) > 0 {
			t.Errorf("client got events %v, want none (the upstream sent none)", cw.types())
		}
		if cw.endedBefore(ctx) {
			t.Errorf("client's stream ended %v before the client's deadline (%v); with --watch-resume-timeout at its default (60s) it must stay open",
				cw.earlyBy(ctx).Round(time.Millisecond), cw.err)
		}
	})

	t.Run("empty-body-resume-timeout", func(t *testing.T) {
		const resumeTimeout = 3 * time.Second
		const bound = resumeTimeout + 4*time.Second
		f := newFakeAPI(t, listOrWatch(emptyWatch))
		p := budgetProxy(t, f.URL(), "--watch-resume-timeout="+resumeTimeout.String())
		eventually(t, 10*time.Second, "watchsan ready", func() bool { return readyz(p) == 200 })
		w0 := f.watches.Load()
		ctx, cancel := context.WithTimeout(context.Background(), window)
		defer cancel()
		start := time.Now()
		cw := openWatch(t, ctx, p.URL+watchPath, nil)
		select {
		case <-cw.ended:
		case <-time.After(bound):
		}
		n := f.watches.Load() - w0
		if !cw.done() {
			t.Logf("budget: --watch-resume-timeout=%v, upstream always empty: client's stream still open after %v, %d upstream watch requests", resumeTimeout, bound, n)
			t.Errorf("client's stream still open %v after it started, with --watch-resume-timeout=%v and an upstream that never delivers (%d upstream watch requests)",
				bound, resumeTimeout, n)
			return
		}
		took := cw.endAt.Sub(start)
		t.Logf("budget: --watch-resume-timeout=%v, upstream always empty: client's stream ended after %v (%v) after %d upstream watch requests",
			resumeTimeout, took.Round(time.Millisecond), cw.err, n)
		if cw.err != io.EOF {
			t.Errorf("client's stream ended with %v, want a clean end (EOF)", cw.err)
		}
		if n > maxRequests {
			t.Errorf("one client watch cost %d upstream watch requests before its stream ended, want at most %d", n, maxRequests)
		}
	})

	t.Run("real-apiserver-timeoutSeconds=-1", func(t *testing.T) {
		c := newCluster(t, cluster.Options{})
		front := newFaultedAPIServer(t, c, 0) // no faults: it only counts watch requests
		p := budgetProxy(t, front.URL, "--upstream-ca-file="+front.CAFile)
		eventually(t, 20*time.Second, "watchsan ready", func() bool { return readyz(p) == 200 })
		cs, err := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
		if err != nil {
			t.Fatal(err)
		}
		list, err := cs.CoreV1().ConfigMaps("default").List(ctxT(t, 30*time.Second), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rv := list.ResourceVersion
		w0 := front.layer.Stats().Watches
		ctx, cancel := context.WithTimeout(context.Background(), window)
		defer cancel()
		cw := openWatch(t, ctx, p.URL+"/api/v1/namespaces/default/configmaps?watch=true&resourceVersion="+rv+"&timeoutSeconds=-1",
			http.Header{"Authorization": {"Bearer " + c.AdminToken}})
		<-ctx.Done()
		n := front.layer.Stats().Watches - w0
		<-cw.ended
		t.Logf("budget: one raw watch resourceVersion=%s&timeoutSeconds=-1 against kube-apiserver: %d upstream watch requests in %v; client saw %v, stream end %v",
			rv, n, window, cw.types(), cw.err)
		if n > maxRequests {
			t.Errorf("one client watch cost %d upstream watch requests in %v, want at most %d", n, window, maxRequests)
		}
		for _, typ := range cw.types() {
			if typ == "ERROR" {
				t.Errorf("client got an ERROR event: %v", cw.types())
				break
			}
		}
		if cw.endedBefore(ctx) && cw.err != io.EOF {
			t.Errorf("client's stream ended with %v, want a clean end (EOF) or none", cw.err)
		}
	})
}

// ---- 3. time to a 503 ----

// TestBudgetTimeTo503: with no usable upstream a request is answered at once (a 503 Status
// with Retry-After), not after the whole --retry-budget (it was 30s, each time).
func TestBudgetTimeTo503(t *testing.T) {
	const bound = 1500 * time.Millisecond

	t.Run("refused", func(t *testing.T) {
		u := "http://" + deadAddr(t)
		p := budgetProxy(t, u)
		// Not ready, and a probe has failed (not only "unknown"): today's upstream_up gauge, or
		// the dial counter.
		eventually(t, 10*time.Second, "watchsan to see its upstream refuse", func() bool {
			text := p.metricsText()
			return readyz(p) == 503 && (strings.Contains(text, `watchsan_upstream_up{upstream="`+u+`"} 0`) ||
				sumMetric(strings.NewReader(text), dialsMetric, map[string]string{"result": "error"}) > 0)
		})
		var list, watch answer
		var wg sync.WaitGroup
		wg.Go(func() { list = fetchWithin(40*time.Second, p.URL+"/api/v1/namespaces") })
		wg.Go(func() {
			watch = fetchWithin(40*time.Second, p.URL+"/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=5")
		})
		wg.Wait()
		require503(t, "GET /api/v1/namespaces, upstream refusing", list, bound)
		require503(t, "watch, upstream refusing", watch, bound)
	})

	t.Run("stopped", func(t *testing.T) {
		// The only upstream was healthy a moment ago, so a request waits for it to come back
		// (a sidecar's apiserver restarting), but at most --retry-budget after it was last
		// seen healthy; then 503 with Retry-After, and from then on at once.
		const budget = 2 * time.Second
		const bound = budget + 1500*time.Millisecond
		f := newFakeAPI(t, listOrWatch(emptyWatch))
		p := budgetProxy(t, f.URL(), "--retry-budget="+budget.String())
		eventually(t, 10*time.Second, "watchsan ready", func() bool { return readyz(p) == 200 })
		if a := fetchWithin(10*time.Second, p.URL+"/api/v1/namespaces"); a.err != nil || a.code != 200 {
			t.Fatalf("a list through watchsan with its upstream up: %v", a)
		}
		f.stop()
		a := fetchWithin(40*time.Second, p.URL+"/api/v1/namespaces")
		require503(t, "GET /api/v1/namespaces right after the only upstream stopped", a, bound)
		require503(t, "GET /api/v1/namespaces once the upstream has been gone longer than the budget",
			fetchWithin(40*time.Second, p.URL+"/api/v1/namespaces"), 1500*time.Millisecond)
	})
}

// ---- 4. the client leaves, or watchsan stops, during a retry wait ----

// TestBudgetNoPanicDuringRetryWait: an upstream that answers every request 429 (or 503) with
// Retry-After: 3 makes watchsan wait before retrying. A client that leaves during the wait, and
// a SIGTERM during it, end the request without a panic; the requests still open at SIGTERM get a
// well-formed Status; watchsan exits 0.
func TestBudgetNoPanicDuringRetryWait(t *testing.T) {
	for _, code := range []int{http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			const shutdownTimeout = 10 * time.Second
			reason := metav1.StatusReasonTooManyRequests
			if code == http.StatusServiceUnavailable {
				reason = metav1.StatusReasonServiceUnavailable
			}
			body, _ := json.Marshal(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
				Message: "try later", Reason: reason, Code: int32(code), Details: &metav1.StatusDetails{RetryAfterSeconds: 3}})
			f := newFakeAPI(t, func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Retry-After", "3")
				w.WriteHeader(code)
				_, _ = w.Write(body)
			})
			p := budgetProxy(t, f.URL(), "--shutdown-timeout="+shutdownTimeout.String())
			eventually(t, 10*time.Second, "watchsan ready", func() bool { return readyz(p) == 200 })
			list := p.URL + "/api/v1/namespaces"
			watch := p.URL + "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=5"

			// The clients leave 300ms in, while watchsan waits out the Retry-After.
			var wg sync.WaitGroup
			for _, u := range []string{list, watch} {
				wg.Go(func() {
					if a := fetchWithin(300*time.Millisecond, u); a.err == nil {
						t.Logf("%s answered before the client left: %v", u, a)
					}
				})
			}
			wg.Wait()
			eventually(t, 10*time.Second, "watchsan to finish the requests whose client left", func() bool {
				return p.Metric("watchsan_requests_in_flight", nil) == 0
			})

			// Two more wait when watchsan gets SIGTERM.
			l0, w0 := f.others.Load(), f.watches.Load()
			var got [2]answer
			var at [2]time.Time
			for i, u := range []string{list, watch} {
				wg.Go(func() { got[i] = fetchWithin(shutdownTimeout+20*time.Second, u); at[i] = time.Now() })
			}
			eventually(t, 10*time.Second, "both requests to reach the upstream and wait in watchsan to retry", func() bool {
				return f.others.Load() > l0 && f.watches.Load() > w0 && p.Metric("watchsan_requests_in_flight", nil) == 2
			})
			term := time.Now()
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			for i, what := range []string{"GET waiting at SIGTERM", "watch waiting at SIGTERM"} {
				a := got[i]
				t.Logf("budget: %d upstream, %s: %v", code, what, a)
				if _, err := a.status(); err != nil {
					t.Errorf("%s: %v; want a well-formed Status (%v)", what, a, err)
				}
				if after := at[i].Sub(term); after > shutdownTimeout+2*time.Second {
					t.Errorf("%s ended %v after SIGTERM, want within --shutdown-timeout=%v", what, after.Round(time.Millisecond), shutdownTimeout)
				}
			}
			select {
			case <-p.exited:
			case <-time.After(shutdownTimeout + 10*time.Second):
				t.Fatalf("watchsan did not exit within %v of SIGTERM", shutdownTimeout+10*time.Second)
			}
			t.Logf("budget: %d upstream: watchsan exited %v after SIGTERM: %v", code, time.Since(term).Round(time.Millisecond), p.exitErr)
			if p.exitErr != nil {
				t.Errorf("watchsan exit: %v, want 0", p.exitErr)
			}
			requireNoPanic(t, p)
		})
	}
}

// ---- 5. --shutdown-delay ----

// requireFlag fails the test unless watchsan's --help lists the flag.
func requireFlag(t *testing.T, name string) {
	t.Helper()
	out, _ := exec.Command(watchsanBin, "--help").CombinedOutput()
	if !strings.Contains(string(out), "-"+name+" ") {
		t.Fatalf("watchsan has no --%s flag: `watchsan --help` does not list it", name)
	}
}

// holdWatch answers a watch with one ADDED event and holds it open until the request ends.
func holdWatch(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","namespace":"default","resourceVersion":"10"}}}`+"\n")
	http.NewResponseController(w).Flush()
	<-r.Context().Done()
}

// TestBudgetShutdownDelay: with --shutdown-delay, SIGTERM fails the admin /readyz at once
// while the main listener keeps serving for the delay; then the listener closes, the open watch
// ends cleanly within --shutdown-timeout, and watchsan exits 0.
func TestBudgetShutdownDelay(t *testing.T) {
	const delay, shutdownTimeout = 3 * time.Second, 5 * time.Second
	requireFlag(t, "shutdown-delay")
	f := newFakeAPI(t, listOrWatch(holdWatch))
	p := budgetProxy(t, f.URL(), "--shutdown-delay="+delay.String(), "--shutdown-timeout="+shutdownTimeout.String())
	eventually(t, 10*time.Second, "watchsan ready", func() bool { return readyz(p) == 200 })
	ctx := ctxT(t, time.Minute)
	cw := openWatch(t, ctx, p.URL+"/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=5", nil)
	eventually(t, 10*time.Second, "the watch's first event", func() bool { return len(cw.types()) > 0 })

	term := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, "admin /readyz to fail after SIGTERM", func() bool { return readyz(p) == 503 })
	t.Logf("budget: --shutdown-delay=%v: /readyz 503 %v after SIGTERM", delay, time.Since(term).Round(time.Millisecond))

	// The main listener serves new connections until the delay has nearly passed.
	served := 0
	for time.Since(term) < delay-500*time.Millisecond {
		a := fetchWithin(2*time.Second, p.URL+"/api/v1/namespaces")
		if a.err != nil || a.code != 200 {
			t.Fatalf("a list through watchsan %v after SIGTERM (within --shutdown-delay=%v): %v", time.Since(term).Round(time.Millisecond), delay, a)
		}
		served++
		time.Sleep(200 * time.Millisecond)
	}
	if cw.done() {
		t.Errorf("the open watch ended %v after SIGTERM, within --shutdown-delay=%v (%v)", cw.endAt.Sub(term), delay, cw.err)
	}

	// Then it closes.
	host := strings.TrimPrefix(p.URL, "http://")
	eventually(t, 3*time.Second, "watchsan's main listener to close after the delay", func() bool {
		c, err := net.DialTimeout("tcp", host, 500*time.Millisecond)
		if err == nil {
			c.Close()
			return false
		}
		return errors.Is(err, syscall.ECONNREFUSED)
	})
	closed := time.Since(term)
	t.Logf("budget: --shutdown-delay=%v: %d lists served after SIGTERM, listener closed %v after SIGTERM", delay, served, closed.Round(time.Millisecond))

	select {
	case <-cw.ended:
	case <-time.After(delay + shutdownTimeout + 3*time.Second - time.Since(term)):
		t.Fatalf("the open watch did not end within --shutdown-delay + --shutdown-timeout of SIGTERM")
	}
	if cw.err != io.EOF {
		t.Errorf("the open watch ended with %v, want a clean end (EOF)", cw.err)
	}
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("watchsan did not exit")
	}
	if p.exitErr != nil {
		t.Errorf("watchsan exit: %v, want 0", p.exitErr)
	}
	requireNoPanic(t, p)
}

// ---- 6. health ----

// TestBudgetHealth: an upstream is unknown (watchsan not ready) until its first probe
// answers; its going down and coming back are each logged once.
func TestBudgetHealth(t *testing.T) {
	t.Run("unknown-until-probed", func(t *testing.T) {
		f := newFakeAPI(t, listOrWatch(emptyWatch))
		const delay = 2 * time.Second
		f.readyzDelay.Store(int64(delay))
		// The default health interval: a probe timeout derived from a short interval could be
		// below the delay.
		p := startProxy(t, "--upstream="+f.URL(), "--no-credentials", "--log-level=info")
		start := time.Now()
		if code := readyz(p); code != 503 {
			t.Logf("budget: /readyz %d at start, before the upstream's first probe answered", code)
			t.Errorf("/readyz answered %d before the upstream's first probe answered, want 503", code)
		}
		deadline := time.Now().Add(15 * time.Second)
		for {
			code := readyz(p)
			if code == 200 {
				if !f.readyzAnswered.Load() {
					t.Fatalf("/readyz answered 200 %v after start, before any probe of the upstream was answered", time.Since(start))
				}
				t.Logf("budget: /readyz 200 %v after start (the upstream's /readyz answers after %v)", time.Since(start).Round(time.Millisecond), delay)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("/readyz still %d 15s after start; the upstream's /readyz answers after %v", code, delay)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})

	t.Run("transitions-logged-once", func(t *testing.T) {
		const observe = 3 * budgetInterval
		f := newFakeAPI(t, listOrWatch(emptyWatch))
		p := budgetProxy(t, f.URL())
		eventually(t, 10*time.Second, "watchsan ready", func() bool { return readyz(p) == 200 })

		from := len(p.logLines())
		f.stop()
		down := time.Now()
		// Clients keep coming while it is down: their refused dials must not log again.
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() { fetchWithin(2*time.Second, p.URL+"/api/v1/namespaces") })
		}
		wg.Wait()
		var sawDown bool
		for time.Since(down) < 10*time.Second && !sawDown {
			sawDown = logCount(p.logLines(), from, "upstream", "upstream unhealthy") > 0
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(observe)
		unhealthy := logCount(p.logLines(), from, "upstream", "upstream unhealthy")
		readyDown := readyz(p)

		from2 := len(p.logLines())
		downFor := time.Since(down)
		f.start()
		eventually(t, 10*time.Second, "watchsan ready again", func() bool { return readyz(p) == 200 })
		time.Sleep(observe)
		lines := p.logLines()
		healthy := logCount(lines, from2, "upstream", "upstream healthy")
		unhealthy += logCount(lines, from2, "upstream", "upstream unhealthy")
		t.Logf("budget: only upstream stopped for ~%v, then back: %q logged %d times, %q %d times; /readyz while down %d",
			downFor.Round(time.Second), "upstream unhealthy", unhealthy, "upstream healthy", healthy, readyDown)
		if unhealthy != 1 {
			t.Errorf("%q logged %d times (logger containing \"upstream\"), want exactly once when the only upstream starts refusing", "upstream unhealthy", unhealthy)
		}
		if healthy != 1 {
			t.Errorf("%q logged %d times after the upstream came back, want exactly once", "upstream healthy", healthy)
		}
		if readyDown != 503 {
			t.Errorf("/readyz answered %d while the only upstream was down, want 503", readyDown)
		}
	})
}

package bench

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/test/cluster"
)

// The storm section: N clients sync the same namespace's configmaps at once as paginated lists
// from resourceVersion "" (a reflector's relist), in two waves: the second starts after a
// configmap is written while the first still syncs, so every client of the second wave must
// list it. Direct, and through watchsan with --coalesce-reads (docs/design.md section 18), in
// the same run on a real kube-apiserver and etcd (test/cluster). The apiserver counts the LISTs
// (apiserver_request_total{verb="LIST",resource="configmaps"}); its CPU is /proc/PID/stat's
// over the storm.

// StormMode is how the clients of a storm run reach the apiserver.
type StormMode string

// The storm modes, in report order.
const (
	// StormDirect: each client its own TLS connection to the apiserver, all with one token.
	StormDirect StormMode = "direct"
	// StormToken: through watchsan --no-credentials, every client with the same token.
	StormToken StormMode = "watchsan-same-token"
	// StormLent: through watchsan lending a kubeconfig's identity: clients send no token.
	StormLent StormMode = "watchsan-lent"
	// StormReviewed: through watchsan --no-credentials, every client a token of its own (of one
	// ServiceAccount): lists shared across them once an access review allowed each.
	StormReviewed StormMode = "watchsan-own-tokens-reviewed"
	// StormOff: through watchsan --no-credentials --coalesce-reads=false, the same token.
	StormOff StormMode = "watchsan-coalesce-off"
)

// StormModes lists the modes in report order.
var StormModes = []StormMode{StormDirect, StormToken, StormLent, StormReviewed, StormOff}

var stormDescription = map[StormMode]string{
	StormDirect:   "each client its own TLS connection to the apiserver, one ServiceAccount token for all",
	StormToken:    "watchsan --no-credentials (--coalesce-reads on by default): every client the same token, passed on",
	StormLent:     "watchsan --kubeconfig: clients send no token, watchsan lends the kubeconfig's identity",
	StormReviewed: "watchsan --no-credentials: every client a token of its own (one ServiceAccount), a list shared across tokens once a SelfSubjectAccessReview with each allowed it",
	StormOff:      "watchsan --no-credentials --coalesce-reads=false: as watchsan-same-token, every read sent on its own",
}

// StormSample is one storm run: 2 waves of Clients paginated lists of Objects configmaps.
type StormSample struct {
	Mode                    StormMode
	Clients, Objects, Limit int
	// Lists is the apiserver's LIST requests of configmaps over the run.
	Lists float64
	// APIServerTicks is the apiserver's CPU (user + system, 10 ms ticks) over the run.
	APIServerTicks int64
	// WatchsanCPU is watchsan's CPU seconds over the run (0 direct).
	WatchsanCPU float64
	// P50, P99 are the clients' sync times (first request to last page), both waves.
	P50, P99 time.Duration
	// Stale counts clients of the second wave whose list lacks the configmap written before
	// they began (must be 0); Incomplete those that did not list every configmap.
	Stale, Incomplete int
	Err               string
}

// StormEnv is a namespace of a running cluster holding the configmaps the storm lists.
type StormEnv struct {
	*FanOutEnv
	Objects int
	Token   string
	seq     atomic.Int64
}

// NewStormEnv creates namespace ns with a ServiceAccount allowed to list its configmaps, tokens
// of it (the first for every client but StormReviewed's, which take one each), and objects
// configmaps of size bytes each.
func NewStormEnv(ctx context.Context, c *cluster.Cluster, ns string, objects, size, tokens int) (*StormEnv, error) {
	fe, err := NewFanOutEnv(ctx, c, ns, tokens)
	if err != nil {
		return nil, err
	}
	e := &StormEnv{FanOutEnv: fe, Objects: objects, Token: fe.Tokens[0]}
	data := map[string]string{"v": strings.Repeat("x", size)}
	err = parallel(ctx, objects, 10, func(i int) error {
		_, err := fe.admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("storm-%05d", i)}, Data: data}, metav1.CreateOptions{})
		return err
	})
	return e, err
}

// StormArgs are watchsan's flags for mode m (nil direct).
func (e *StormEnv) StormArgs(m StormMode) []string {
	api := e.Cluster.APIServers[0].URL
	switch m {
	case StormToken, StormReviewed:
		return []string{"--upstream", api, "--upstream-ca-file", e.Cluster.CAFile, "--no-credentials"}
	case StormLent:
		return []string{"--kubeconfig", e.LentKubeconfig}
	case StormOff:
		return []string{"--upstream", api, "--upstream-ca-file", e.Cluster.CAFile, "--no-credentials", "--coalesce-reads=false"}
	}
	return nil
}

// stormClient is one client's sync.
type stormClient struct {
	took  time.Duration
	names map[string]bool
	err   error
}

// sync lists u page by page (limit per page) over rt, with token unless empty.
func (c *stormClient) sync(ctx context.Context, rt http.RoundTripper, u, token string, limit int) {
	start := time.Now()
	defer func() { c.took = time.Since(start) }()
	c.names = map[string]bool{}
	cont, retries := "", 0
	for page := 0; page < 10000; page++ {
		q := fmt.Sprintf("%s?limit=%d", u, limit)
		if cont != "" {
			q += "&continue=" + url.QueryEscape(cont)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, q, nil)
		req.Header.Set("Accept", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := rt.RoundTrip(req)
		if err != nil {
			c.err = err
			return
		}
		// client-go's REST client repeats a 429 with Retry-After (up to 10 times): a storm
		// past the apiserver's max-in-flight gets them.
		if resp.StatusCode == http.StatusTooManyRequests && retries < 10 {
			resp.Body.Close()
			retries++
			page--
			sleepCtx(ctx, time.Second)
			continue
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			resp.Body.Close()
			c.err = fmt.Errorf("%s: %s", resp.Status, b)
			return
		}
		// Names and the continue token by a scan, not a decode: the bench's clients share the
		// machine with the apiserver, and what is measured is the apiserver's work.
		body, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20)) // one page, bounded
		resp.Body.Close()
		if err != nil {
			c.err = err
			return
		}
		var p struct{ Metadata struct{ Continue string } }
		if i := bytes.Index(body, []byte(`"items":`)); i < 0 || json.Unmarshal(append(bytes.TrimRight(body[:i:i], ","), '}'), &p) != nil {
			c.err = fmt.Errorf("page %d: no list: %.200s", page, body)
			return
		} else {
			for rest := body[i:]; ; {
				j := bytes.Index(rest, []byte(`{"metadata":{"name":"`))
				if j < 0 {
					break
				}
				rest = rest[j+len(`{"metadata":{"name":"`):]
				k := bytes.IndexByte(rest, '"')
				if k < 0 {
					break
				}
				c.names[string(rest[:k])] = true
				rest = rest[k:]
			}
		}
		if cont = p.Metadata.Continue; cont == "" {
			return
		}
	}
}

// Measure runs one storm through base (the apiserver's URL, or watchsan's main listener with
// its pid) with n clients a wave, pages of limit.
func (e *StormEnv) Measure(ctx context.Context, m StormMode, base string, pid, n, limit int, timeout time.Duration) (s StormSample) {
	s = StormSample{Mode: m, Clients: n, Objects: e.Objects, Limit: limit}
	fail := func(err error) StormSample { s.Err = err.Error(); return s }
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(e.Cluster.CAData) {
		return fail(errors.New("the cluster's CA: no certificate"))
	}
	token := e.Token
	if m == StormLent {
		token = ""
	}
	// One connection per client, kept across its pages, as a client-go client has.
	transports := make([]*http.Transport, 2*n)
	for i := range transports {
		transports[i] = &http.Transport{MaxIdleConnsPerHost: 1}
		if m == StormDirect {
			transports[i].TLSClientConfig = &tls.Config{RootCAs: pool}
		}
	}
	defer func() {
		for _, t := range transports {
			t.CloseIdleConnections()
		}
	}()
	listCount := func() (float64, error) {
		return e.APIServerMetric(ctx, "apiserver_request_total", map[string]string{"verb": "LIST", "resource": "configmaps"})
	}
	e.settle(ctx)
	l0, err := listCount()
	if err != nil {
		return fail(err)
	}
	t0, err := e.apiserverTicks()
	if err != nil {
		return fail(err)
	}
	cpu0 := 0.0
	if pid != 0 {
		cpu0, _ = procCPU(pid)
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	u := fmt.Sprintf("%s/api/v1/namespaces/%s/configmaps", base, e.Namespace)
	clients := make([]*stormClient, 2*n)
	var firstPage atomic.Int32
	var wg sync.WaitGroup
	wave := func(from int) {
		for i := from; i < from+n; i++ {
			clients[i] = &stormClient{}
			wg.Add(1)
			tok := token
			if m == StormReviewed {
				tok = e.Tokens[i%len(e.Tokens)]
			}
			go func(c *stormClient, rt http.RoundTripper) {
				defer wg.Done()
				c.sync(rctx, countFirst{rt, &firstPage}, u, tok, limit)
			}(clients[i], transports[i])
		}
	}
	wave(0)
	// The write comes while the first wave syncs: once a client has its first page.
	for firstPage.Load() == 0 && rctx.Err() == nil {
		sleepCtx(rctx, time.Millisecond)
	}
	late := fmt.Sprintf("storm-late-%d", e.seq.Add(1))
	if _, err := e.admin.CoreV1().ConfigMaps(e.Namespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: late}}, metav1.CreateOptions{}); err != nil {
		cancel()
		wg.Wait()
		return fail(err)
	}
	wave(n)
	wg.Wait()
	t1, err := e.apiserverTicks()
	if err != nil {
		return fail(err)
	}
	s.APIServerTicks = t1 - t0
	if pid != 0 {
		cpu1, _ := procCPU(pid)
		s.WatchsanCPU = cpu1 - cpu0
	}
	l1, err := listCount()
	if err != nil {
		return fail(err)
	}
	s.Lists = l1 - l0
	var took []time.Duration
	var errs []string
	for i, c := range clients {
		if c.err != nil {
			if len(errs) < 3 {
				errs = append(errs, c.err.Error())
			}
			continue
		}
		took = append(took, c.took)
		n := 0
		for name := range c.names {
			if !strings.HasPrefix(name, "storm-late-") {
				n++
			}
		}
		if n != e.Objects {
			s.Incomplete++
		}
		if i >= len(clients)/2 && !c.names[late] {
			s.Stale++
		}
	}
	slices.Sort(took)
	if len(took) > 0 {
		s.P50, s.P99 = took[(len(took)-1)/2], took[min(len(took)-1, len(took)*99/100)]
	}
	if len(errs) > 0 || s.Stale+s.Incomplete > 0 {
		s.Err = fmt.Sprintf("%d clients failed (%s), %d stale, %d incomplete", len(clients)-len(took), strings.Join(errs, "; "), s.Stale, s.Incomplete)
	}
	return s
}

// countFirst counts the first successful response through it.
type countFirst struct {
	http.RoundTripper
	n *atomic.Int32
}

func (c countFirst) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.RoundTripper.RoundTrip(r)
	if err == nil && resp.StatusCode == http.StatusOK {
		c.n.Add(1)
	}
	return resp, err
}

// StormResult is the storm runs: one sample per mode, with the median apiserver CPU of its
// repetitions.
type StormResult struct {
	Clients, Objects, ObjectBytes, Limit int
	Samples                              []StormSample
	Runs                                 []StormSample `json:",omitempty"`
}

// AddRun adds a run and picks each mode's median run again (a failed one stands).
func (r *StormResult) AddRun(s StormSample) {
	r.Runs = append(r.Runs, s)
	r.Samples = nil
	for _, m := range StormModes {
		var runs []StormSample
		for _, x := range r.Runs {
			if x.Mode == m {
				if x.Err != "" {
					runs = []StormSample{x}
					break
				}
				runs = append(runs, x)
			}
		}
		if len(runs) == 0 {
			continue
		}
		slices.SortStableFunc(runs, func(a, b StormSample) int { return int(a.APIServerTicks - b.APIServerTicks) })
		r.Samples = append(r.Samples, runs[(len(runs)-1)/2])
	}
}

// Of returns the sample of mode m, or nil.
func (r *StormResult) Of(m StormMode) *StormSample {
	for i := range r.Samples {
		if r.Samples[i].Mode == m {
			return &r.Samples[i]
		}
	}
	return nil
}

// storm is the bench's storm phase: a cluster of its own, the configmaps, then each mode
// (watchsan a fresh process for each), StormReps times.
func (r *runner) storm(ctx context.Context) {
	c, err := cluster.Start(ctx, cluster.Options{})
	if err != nil {
		r.fail("storm: starting kube-apiserver and etcd (make cluster-bins): %v", err)
		return
	}
	defer c.Stop()
	cfg := r.cfg
	e, err := NewStormEnv(ctx, c, "storm", cfg.StormObjects, cfg.StormObjectBytes, 2*cfg.StormClients)
	if err != nil {
		r.fail("storm: %v", err)
		return
	}
	defer e.Close()
	r.res.StormAPIServer = apiserverVersion(ctx, e.FanOutEnv)
	r.progress("storm      cluster up, %d configmaps of %d bytes", cfg.StormObjects, cfg.StormObjectBytes)
	res := &StormResult{Clients: cfg.StormClients, Objects: cfg.StormObjects, ObjectBytes: cfg.StormObjectBytes, Limit: cfg.StormLimit}
	r.res.Storm = res
	timeout := 2*time.Minute + time.Duration(cfg.StormClients*cfg.StormObjects/1000)*time.Second
	for rep := 0; rep < max(1, cfg.StormReps); rep++ {
		for _, m := range StormModes {
			if ctx.Err() != nil {
				return
			}
			base, pid := c.APIServers[0].URL, 0
			var p *proc
			if m != StormDirect {
				if p, err = cfg.Launcher.startFanOut(ctx, e.StormArgs(m)); err != nil {
					r.fail("storm %s: %v", m, err)
					continue
				}
				base, pid = p.url, p.pid
			}
			s := e.Measure(ctx, m, base, pid, cfg.StormClients, cfg.StormLimit, timeout)
			if p != nil {
				p.stop()
			}
			res.AddRun(s)
			r.progress("storm      %-24s %4d clients x2 rep %d: %4.0f LISTs, apiserver %5d ticks, watchsan %.2fs CPU, sync p50 %v p99 %v, stale %d %s",
				m, cfg.StormClients, rep+1, s.Lists, s.APIServerTicks, s.WatchsanCPU, s.P50.Round(time.Millisecond), s.P99.Round(time.Millisecond), s.Stale, s.Err)
		}
	}
}

// writeStorm is the storm section.
func writeStorm(p func(string, ...any), r *Results) {
	s := r.Storm
	p("## Relist storm: N clients syncing the same configmaps at once")
	p("")
	p("%d clients list the same %d configmaps of %d bytes at once, as paginated lists from resourceVersion \"\" (limit=%d, continue", s.Clients, s.Objects, s.ObjectBytes, s.Limit)
	p("pages: a reflector's relist), in two waves: the second starts once a configmap has been written after a client of the first")
	p("had its first page, so each of its %d clients must list that configmap (a stale answer otherwise). On a kube-apiserver %s", s.Clients, orDash(r.StormAPIServer))
	p("and etcd of their own (test/cluster). LISTs are the apiserver's `apiserver_request_total{verb=\"LIST\",resource=\"configmaps\"}`")
	p("over the run; its CPU is /proc/PID/stat's (10 ms ticks) from the first request to the last page, after it settled. Sync")
	p("times are each client's first request to its last page, both waves. Each row is the run with the median apiserver CPU")
	p("of its repetitions, each with a fresh watchsan (docs/design.md section 18).")
	if e := r.StormEnv; e != nil {
		p("%s", takenApart("storm", e))
	}
	p("")
	for _, m := range StormModes {
		p("- `%s`: %s", m, stormDescription[m])
	}
	p("")
	p("| path | LISTs at the apiserver | apiserver CPU (ticks) | vs direct | watchsan CPU | sync p50 | sync p99 | p99 vs direct | stale | checked |")
	p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	d := s.Of(StormDirect)
	for i := range s.Samples {
		x := &s.Samples[i]
		cpuRatio, p99Ratio := "—", "—"
		if d != nil {
			cpuRatio, p99Ratio = ratio(float64(x.APIServerTicks), float64(d.APIServerTicks)), ratio(float64(x.P99), float64(d.P99))
		}
		wcpu := "—"
		if x.Mode != StormDirect {
			wcpu = fmt.Sprintf("%.2f s", x.WatchsanCPU)
		}
		check := "every list complete"
		if x.Err != "" {
			check = "error: " + oneLine(x.Err)
		}
		p("| %s | %.0f | %d | %s | %s | %s | %s | %s | %d | %s |", x.Mode, x.Lists, x.APIServerTicks, cpuRatio, wcpu, fmtDur(x.P50), fmtDur(x.P99), p99Ratio, x.Stale, check)
	}
	p("")
}

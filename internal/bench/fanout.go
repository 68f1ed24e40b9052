package bench

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/watchsan/watchsan/test/cluster"
)

// The fan-out section: N identical watches of one namespace's configmaps, all
// from the same resourceVersion, on a real kube-apiserver and etcd (test/cluster, with the
// binaries of .cache/bin), direct and through watchsan three ways; then W configmaps are
// written. The apiserver counts the upstream watches (apiserver_longrunning_requests), its
// CPU for the fan-out is its CPU over the writes minus that of the same writes with no watcher
// (the targets in docs/bench/NOTES.md), and every client must see every write exactly once and in order.
// TestShareFanOut (test/e2e) asserts those numbers with the same code at 300 clients.

// FanOutMode is how the clients of a fan-out run reach the apiserver.
type FanOutMode string

// The fan-out modes, in report order.
const (
	// FanDirect: each client its own TLS connection and token to the apiserver.
	FanDirect FanOutMode = "direct"
	// FanOwn: through watchsan without sharing, each client's own token passed on
	// (--no-credentials): one upstream watch per client, on watchsan's HTTP/2 connection.
	FanOwn FanOutMode = "watchsan-own-tokens"
	// FanReviewed: --share-watches with each client's own token: a client joins the feed once
	// a SelfSubjectAccessReview with its token allowed the watch.
	FanReviewed FanOutMode = "watchsan-share-reviewed"
	// FanLent: --share-watches lending a kubeconfig's identity (sidecar, node-local): clients
	// send no token.
	FanLent FanOutMode = "watchsan-share-lent"
)

// FanOutModes lists the modes in report order.
var FanOutModes = []FanOutMode{FanDirect, FanOwn, FanReviewed, FanLent}

var fanOutDescription = map[FanOutMode]string{
	FanDirect:   "each client its own TLS connection and ServiceAccount token to the apiserver",
	FanOwn:      "watchsan --no-credentials: each client's token passed on, one upstream watch per client",
	FanReviewed: "watchsan --no-credentials --share-watches: each client's own token, admitted to the feed by a SelfSubjectAccessReview",
	FanLent:     "watchsan --kubeconfig --share-watches: clients send no token, watchsan lends the kubeconfig's identity",
}

// FanOutSample is one fan-out run: Clients identical watches, then Writes configmaps written.
type FanOutSample struct {
	Mode    FanOutMode
	Clients int
	Writes  int
	// UpstreamWatches is the apiserver's open WATCH requests of configmaps with the clients'
	// watches open, minus before they were opened.
	UpstreamWatches float64
	// APIServerTicks is the apiserver's CPU (user + system, 10 ms ticks) from the first write
	// until every client had every write.
	APIServerTicks int64
	// WatchsanCPU is watchsan's CPU seconds over the same span (0 direct); WatchsanRSS its
	// resident memory before the clients opened their watches and with them open, KiB.
	WatchsanCPU                          float64
	WatchsanRSSBeforeKiB, WatchsanRSSKiB int64
	// Opened is how long opening every watch took; Delivered the time from the first write
	// until every client had every write.
	Opened, Delivered time.Duration
	// Clients that missed, saw twice or out of resourceVersion order a write (any of them is
	// an error).
	Short, Duplicated, Reordered int
	Err                          string
}

// WatchsanCPUPerSubscriberMs is watchsan's CPU over the writes per client watch, ms.
func (s *FanOutSample) WatchsanCPUPerSubscriberMs() float64 {
	if s.Clients == 0 {
		return 0
	}
	return s.WatchsanCPU * 1000 / float64(s.Clients)
}

// WatchsanKiBPerSubscriber is watchsan's resident memory growth per client watch.
func (s *FanOutSample) WatchsanKiBPerSubscriber() float64 {
	if s.Clients == 0 {
		return 0
	}
	return float64(s.WatchsanRSSKiB-s.WatchsanRSSBeforeKiB) / float64(s.Clients)
}

// FanOutTarget is where a fan-out run's clients watch.
type FanOutTarget struct {
	Mode FanOutMode
	// URL is the apiserver's (FanDirect) or watchsan's main listener.
	URL string
	// PID and AdminURL are watchsan's process and admin listener (unset for FanDirect).
	PID      int
	AdminURL string
	// WhileOpen, if set, is called with every watch open, before the writes (outside what is
	// measured), e.g. to read watchsan's feeds.
	WhileOpen func()
	// Stop, if set, ends watchsan once the clients are gone, before Measure waits for the
	// apiserver to let go of the upstream watches (a feed outlives its last subscriber a while).
	Stop func()
}

// FanOutEnv is a namespace of a running cluster set up for fan-out runs: a ServiceAccount
// allowed to watch its configmaps, and one token of it per client.
type FanOutEnv struct {
	Cluster   *cluster.Cluster
	Namespace string
	// Tokens are distinct tokens of the ServiceAccount, one per client (TokenRequest).
	Tokens []string
	// LentKubeconfig is a kubeconfig of the apiserver with the admin token, for FanLent.
	LentKubeconfig string

	admin   kubernetes.Interface
	metrics *http.Client // the apiserver's /metrics, as admin
	tls     *http.Transport
	plain   *http.Transport
	seq     atomic.Int64
}

// NewFanOutEnv creates namespace ns in c with a ServiceAccount allowed to get, list and watch
// its configmaps and `clients` tokens of it.
func NewFanOutEnv(ctx context.Context, c *cluster.Cluster, ns string, clients int) (*FanOutEnv, error) {
	cfg := c.RESTConfig(0, c.AdminToken)
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	metrics, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(c.CAData) {
		return nil, errors.New("the cluster's CA: no certificate")
	}
	e := &FanOutEnv{Cluster: c, Namespace: ns, admin: admin, metrics: metrics,
		// HTTP/1.1 (no ForceAttemptHTTP2): one TLS connection per watch, as separate clients have.
		tls:   &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: -1},
		plain: &http.Transport{MaxIdleConnsPerHost: -1},
	}
	e.LentKubeconfig = filepath.Join(c.Dir, "fanout-lent.kubeconfig")
	if err := c.WriteKubeconfig(e.LentKubeconfig, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
		return nil, err
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("namespace %s: %w", ns, err)
	}
	const sa = "fanout"
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "cm-watcher"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "cm-watchers"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "cm-watcher"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	e.Tokens = make([]string, clients)
	hour := int64(3600)
	err = parallel(ctx, clients, 10, func(i int) error {
		tr, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &hour}}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("token %d: %w", i, err)
		}
		e.Tokens[i] = tr.Status.Token
		return nil
	})
	return e, err
}

// Close closes the clients' idle connections.
func (e *FanOutEnv) Close() {
	e.tls.CloseIdleConnections()
	e.plain.CloseIdleConnections()
	e.metrics.CloseIdleConnections()
}

// parallel runs f(0..n-1), at most k at a time, and returns the first error.
func parallel(ctx context.Context, n, k int, f func(i int) error) error {
	sem := make(chan struct{}, k)
	errc := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return ctx.Err()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := f(i); err != nil {
				errc <- err
			}
		}()
	}
	wg.Wait()
	close(errc)
	return <-errc // nil when closed empty
}

// APIServerMetric is the sum of the apiserver's samples of name whose labels include want.
func (e *FanOutEnv) APIServerMetric(ctx context.Context, name string, want map[string]string) (float64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.Cluster.APIServers[0].URL+"/metrics", nil)
	return scrape(e.metrics, req, name, want)
}

// upstreamWatches is the apiserver's open WATCH requests of configmaps.
func (e *FanOutEnv) upstreamWatches(ctx context.Context) (float64, error) {
	return e.APIServerMetric(ctx, "apiserver_longrunning_requests", map[string]string{"verb": "WATCH", "resource": "configmaps"})
}

// scrape reads a Prometheus text exposition and sums the samples of name whose labels include
// want (counters, gauges and untyped).
func scrape(hc *http.Client, req *http.Request, name string, want map[string]string) (float64, error) {
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", req.URL, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", req.URL, err)
	}
	var sum float64
	for _, m := range fams[name].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		ok := true
		for k, v := range want {
			ok = ok && labels[k] == v
		}
		if !ok {
			continue
		}
		switch {
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum, nil
}

func (e *FanOutEnv) apiserverTicks() (int64, error) {
	s, err := procCPU(e.Cluster.APIServers[0].Pid())
	return int64(s*clockTicks + 0.5), err
}

// settle waits, at most 15 s, until the apiserver is quiet (at most 2 ticks of CPU in half a
// second), so that what a run's writes are charged does not include the tail of what came
// before (the previous run's watches ending, its garbage collected).
func (e *FanOutEnv) settle(ctx context.Context) {
	deadline := time.Now().Add(15 * time.Second)
	prev, err := e.apiserverTicks()
	for err == nil && time.Now().Before(deadline) && ctx.Err() == nil {
		sleepCtx(ctx, 500*time.Millisecond)
		var now int64
		if now, err = e.apiserverTicks(); now-prev <= 2 {
			return
		}
		prev = now
	}
}

// write creates n configmaps named prefix0.., 10 at a time.
func (e *FanOutEnv) write(ctx context.Context, prefix string, n int) error {
	return parallel(ctx, n, 10, func(i int) error {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: prefix + strconv.Itoa(i)}, Data: map[string]string{"i": strconv.Itoa(i)}}
		_, err := e.admin.CoreV1().ConfigMaps(e.Namespace).Create(ctx, cm, metav1.CreateOptions{})
		return err
	})
}

// Baseline is the apiserver's CPU ticks for `writes` writes with no watcher of them.
func (e *FanOutEnv) Baseline(ctx context.Context, writes int) (int64, error) {
	prefix := fmt.Sprintf("base%d-", e.seq.Add(1))
	e.settle(ctx)
	t0, err := e.apiserverTicks()
	if err != nil {
		return 0, err
	}
	if err := e.write(ctx, prefix, writes); err != nil {
		return 0, err
	}
	t1, err := e.apiserverTicks()
	return t1 - t0, err
}

// fanClient is one client watch of a fan-out run.
type fanClient struct {
	got            atomic.Int32 // distinct writes seen
	dup, reordered bool
}

// read reads a JSON watch stream until it ends, recording the ADDED events of objects named
// prefix<i>, i < writes.
func (c *fanClient) read(r io.Reader, prefix string, writes int) {
	seen := make([]bool, writes)
	var last uint64
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var ev struct {
			Type   string
			Object struct {
				Metadata struct{ Name, ResourceVersion string }
			}
		}
		if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Type != "ADDED" || !strings.HasPrefix(ev.Object.Metadata.Name, prefix) {
			continue
		}
		i, err := strconv.Atoi(strings.TrimPrefix(ev.Object.Metadata.Name, prefix))
		rv, err2 := strconv.ParseUint(ev.Object.Metadata.ResourceVersion, 10, 64)
		if err != nil || err2 != nil || i < 0 || i >= writes {
			continue
		}
		if seen[i] {
			c.dup = true
			continue
		}
		if rv <= last {
			c.reordered = true
		}
		last = rv
		seen[i] = true
		c.got.Add(1)
	}
}

// waitOpen waits until n watches are open at the far end of t: the apiserver holds every
// direct watch (over base, what it held before), watchsan every client watch (t.PID set).
func (e *FanOutEnv) waitOpen(ctx context.Context, t FanOutTarget, base float64, n int, timeout time.Duration) error {
	open := func() (bool, error) {
		if t.PID == 0 {
			w, err := e.upstreamWatches(ctx)
			return w-base >= float64(n), err
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, t.AdminURL+"/metrics", nil)
		w, err := scrape(http.DefaultClient, req, "watchsan_open_watches", nil)
		return w >= float64(n), err
	}
	for deadline := time.Now().Add(timeout); ; {
		ok, err := open()
		if ok {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%d watches not all open within %v (%v)", n, timeout, err)
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
}

// waitUpstreamBack waits, at most d, until the apiserver holds no more watches of configmaps
// than base again, so that the next run counts from what it holds without this one's.
func (e *FanOutEnv) waitUpstreamBack(ctx context.Context, base float64, d time.Duration) {
	for deadline := time.Now().Add(d); time.Now().Before(deadline) && ctx.Err() == nil; {
		if w, err := e.upstreamWatches(ctx); err == nil && w <= base {
			return
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

// Measure runs n identical watches through t, writes `writes` configmaps, and waits until
// every client had every one (or timeout). It needs len(e.Tokens) ≥ n except for FanLent.
func (e *FanOutEnv) Measure(ctx context.Context, t FanOutTarget, n, writes int, timeout time.Duration) (s FanOutSample) {
	s = FanOutSample{Mode: t.Mode, Clients: n, Writes: writes}
	fail := func(err error) FanOutSample { s.Err = err.Error(); return s }
	if t.Mode != FanLent && len(e.Tokens) < n {
		return fail(fmt.Errorf("%d tokens for %d clients", len(e.Tokens), n))
	}
	prefix := fmt.Sprintf("fan%d-", e.seq.Add(1))
	list, err := e.admin.CoreV1().ConfigMaps(e.Namespace).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return fail(err)
	}
	base, err := e.upstreamWatches(ctx)
	if err != nil {
		return fail(err)
	}
	if t.PID != 0 {
		s.WatchsanRSSBeforeKiB, _ = procStatus(t.PID, "VmRSS")
	}
	rt := e.plain
	if t.Mode == FanDirect {
		rt = e.tls
	}
	wctx, stop := context.WithCancel(ctx)
	clients := make([]*fanClient, n)
	var wg sync.WaitGroup
	defer func() {
		stop()
		wg.Wait()
		e.plain.CloseIdleConnections()
		e.tls.CloseIdleConnections()
		if t.Stop != nil {
			t.Stop()
		}
		e.waitUpstreamBack(ctx, base, 30*time.Second)
	}()
	url := fmt.Sprintf("%s/api/v1/namespaces/%s/configmaps?watch=true&allowWatchBookmarks=true&resourceVersion=%s", t.URL, e.Namespace, list.ResourceVersion)
	start := time.Now()
	err = parallel(ctx, n, 16, func(i int) error {
		req, _ := http.NewRequestWithContext(wctx, http.MethodGet, url, nil)
		if t.Mode != FanLent {
			req.Header.Set("Authorization", "Bearer "+e.Tokens[i])
		}
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return fmt.Errorf("watch %d: %w", i, err)
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			resp.Body.Close()
			return fmt.Errorf("watch %d: %s %s", i, resp.Status, b)
		}
		c := &fanClient{}
		clients[i] = c
		wg.Add(1)
		go func() { // ends with wctx
			defer wg.Done()
			defer resp.Body.Close()
			c.read(resp.Body, prefix, writes)
		}()
		return nil
	})
	if err != nil {
		return fail(err)
	}
	if err := e.waitOpen(ctx, t, base, n, timeout); err != nil {
		return fail(err)
	}
	s.Opened = time.Since(start)
	if s.UpstreamWatches, err = e.upstreamWatches(ctx); err != nil {
		return fail(err)
	}
	s.UpstreamWatches -= base
	if t.WhileOpen != nil {
		t.WhileOpen()
	}

	e.settle(ctx)
	t0, err := e.apiserverTicks()
	if err != nil {
		return fail(err)
	}
	cpu0 := 0.0
	if t.PID != 0 {
		cpu0, _ = procCPU(t.PID)
	}
	start = time.Now()
	if err := e.write(ctx, prefix, writes); err != nil {
		return fail(fmt.Errorf("writing: %w", err))
	}
	all := func() bool {
		for _, c := range clients {
			if int(c.got.Load()) < writes {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(timeout); !all() && time.Now().Before(deadline) && ctx.Err() == nil; {
		sleepCtx(ctx, 5*time.Millisecond)
	}
	s.Delivered = time.Since(start)
	t1, err := e.apiserverTicks()
	if err != nil {
		return fail(err)
	}
	s.APIServerTicks = t1 - t0
	if t.PID != 0 {
		cpu1, _ := procCPU(t.PID)
		s.WatchsanCPU = cpu1 - cpu0
		s.WatchsanRSSKiB, _ = procStatus(t.PID, "VmRSS")
	}
	stop()
	wg.Wait()
	for _, c := range clients {
		if int(c.got.Load()) < writes {
			s.Short++
		}
		if c.dup {
			s.Duplicated++
		}
		if c.reordered {
			s.Reordered++
		}
	}
	if s.Short+s.Duplicated+s.Reordered > 0 {
		s.Err = fmt.Sprintf("of %d clients %d missed writes (within %v), %d saw one twice, %d out of order", n, s.Short, timeout, s.Duplicated, s.Reordered)
	}
	return s
}

// FanOutResult is the fan-out runs at one number of clients: the baseline and one sample per mode.
type FanOutResult struct {
	Clients, Writes int
	// BaselineTicks is the apiserver's CPU for the same writes with no watcher (the median of
	// the runs in Baselines).
	BaselineTicks int64
	Baselines     []int64
	// Samples has one sample per mode: of its Runs, the one with the median apiserver CPU (or
	// one that failed).
	Samples []FanOutSample
	Runs    []FanOutSample `json:",omitempty"`
}

// AddRun adds a run of one mode to Runs and picks Samples again: each mode's median run.
func (r *FanOutResult) AddRun(s FanOutSample) {
	r.Runs = append(r.Runs, s)
	r.pickSamples()
}

// pickSamples sets Samples from Runs.
func (r *FanOutResult) pickSamples() {
	r.Samples = nil
	for _, m := range FanOutModes {
		var runs []FanOutSample
		for _, s := range r.Runs {
			if s.Mode == m {
				if s.Err != "" {
					runs = []FanOutSample{s}
					break
				}
				runs = append(runs, s)
			}
		}
		if len(runs) == 0 {
			continue
		}
		slices.SortStableFunc(runs, func(a, b FanOutSample) int { return cmp.Compare(a.APIServerTicks, b.APIServerTicks) })
		r.Samples = append(r.Samples, runs[(len(runs)-1)/2])
	}
}

// RunTicks lists the apiserver's CPU over the writes of mode m's runs.
func (r *FanOutResult) RunTicks(m FanOutMode) []int64 {
	var out []int64
	for _, s := range r.Runs {
		if s.Mode == m {
			out = append(out, s.APIServerTicks)
		}
	}
	return out
}

// SetBaseline sets BaselineTicks, the median of Baselines.
func (r *FanOutResult) SetBaseline() {
	f := make([]float64, len(r.Baselines))
	for i, x := range r.Baselines {
		f[i] = float64(x)
	}
	r.BaselineTicks = int64(median(f) + 0.5)
}

// FanOutTicks is a sample's apiserver CPU for the fan-out: over the writes, minus the baseline.
func (r *FanOutResult) FanOutTicks(s *FanOutSample) int64 { return s.APIServerTicks - r.BaselineTicks }

// Of returns the sample of mode m, or nil.
func (r *FanOutResult) Of(m FanOutMode) *FanOutSample {
	for i := range r.Samples {
		if r.Samples[i].Mode == m {
			return &r.Samples[i]
		}
	}
	return nil
}

// FanOutArgs are watchsan's flags for mode m in front of e's apiserver (nil for FanDirect).
func (e *FanOutEnv) FanOutArgs(m FanOutMode) []string {
	api := e.Cluster.APIServers[0].URL
	switch m {
	case FanOwn:
		return []string{"--upstream", api, "--upstream-ca-file", e.Cluster.CAFile, "--no-credentials", "--share-watches=false"}
	case FanReviewed:
		return []string{"--upstream", api, "--upstream-ca-file", e.Cluster.CAFile, "--no-credentials", "--share-watches"}
	case FanLent:
		return []string{"--kubeconfig", e.LentKubeconfig, "--share-watches"}
	}
	return nil
}

// fanout is the bench's fan-out phase: a cluster of its own, then for each number of clients
// the baseline and every mode, watchsan a fresh process for each.
func (r *runner) fanout(ctx context.Context) {
	c, err := cluster.Start(ctx, cluster.Options{})
	if err != nil {
		r.fail("fan-out: starting kube-apiserver and etcd (make cluster-bins): %v", err)
		return
	}
	defer c.Stop()
	maxN := maxInt(r.cfg.FanOutClients)
	e, err := NewFanOutEnv(ctx, c, "fanout", maxN)
	if err != nil {
		r.fail("fan-out: %v", err)
		return
	}
	defer e.Close()
	r.res.FanOutAPIServer = apiserverVersion(ctx, e)
	r.progress("fan-out    cluster up, %d tokens", maxN)
	writes := r.cfg.FanOutWrites
	timeout := 60*time.Second + time.Duration(maxN)*20*time.Millisecond
	for _, n := range r.cfg.FanOutClients {
		fr := &FanOutResult{Clients: n, Writes: writes}
		r.res.FanOut = append(r.res.FanOut, fr)
		for rep := 0; rep < max(1, r.cfg.FanOutReps); rep++ {
			for _, m := range FanOutModes {
				if ctx.Err() != nil {
					return
				}
				b, err := e.Baseline(ctx, writes)
				if err != nil {
					r.fail("fan-out baseline: %v", err)
					return
				}
				fr.Baselines = append(fr.Baselines, b)
				t := FanOutTarget{Mode: m, URL: c.APIServers[0].URL}
				var p *proc
				if m != FanDirect {
					if p, err = r.cfg.Launcher.startFanOut(ctx, e.FanOutArgs(m)); err != nil {
						r.fail("fan-out %s: %v", m, err)
						continue
					}
					t.URL, t.PID, t.AdminURL, t.Stop = p.url, p.pid, p.admin, p.stop
				}
				s := e.Measure(ctx, t, n, writes, timeout)
				fr.AddRun(s)
				r.progress("fan-out    %-24s %5d clients rep %d: upstream watches %4.0f, apiserver %4d ticks (baseline %d), watchsan %.2fs CPU %.1f KiB/sub, opened %v delivered %v %s",
					m, n, rep+1, s.UpstreamWatches, s.APIServerTicks, b, s.WatchsanCPU, s.WatchsanKiBPerSubscriber(), s.Opened.Round(time.Millisecond), s.Delivered.Round(time.Millisecond), s.Err)
			}
		}
		fr.SetBaseline()
	}
}

// apiserverVersion is the apiserver's gitVersion, for the report.
func apiserverVersion(ctx context.Context, e *FanOutEnv) string {
	v, err := e.admin.Discovery().ServerVersion()
	if err != nil || ctx.Err() != nil {
		return "unknown"
	}
	return v.GitVersion
}

// startFanOut starts watchsan with args (its upstream and credentials) for the fan-out.
func (l *Launcher) startFanOut(ctx context.Context, args []string) (*proc, error) {
	argv := append(append([]string{}, l.Watchsan...), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--log-level", "error", "--max-connections", strconv.Itoa(watchsanMaxConn()))
	argv = append(append(argv, args...), l.WatchsanExtra...)
	p, err := spawn("watchsan", argv, append([]string{"KUBECONFIG=" + os.DevNull}, l.WatchsanEnv...))
	if err != nil {
		return nil, err
	}
	p.tls = slices.Contains(args, "--tls-cert-file")
	if err := p.ready(ctx, 2); err != nil {
		return nil, err
	}
	return p, nil
}

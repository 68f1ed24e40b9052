package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/cert"

	"github.com/watchsan/watchsan/test/cluster"
)

// The scale section (a tier for large clusters): W watchers spread evenly over F feeds, the
// configmaps of F namespaces, on a real kube-apiserver and etcd (test/cluster), direct and
// through one watchsan, over HTTP/1.1 (one connection a watch: the sidecar, the node-local
// proxy) and over HTTP/2 with TLS (100 watches a connection: the frontend); then Writes
// configmaps are written, round-robin over the namespaces, 10 at a time. For every write and
// every watcher of its namespace the delivery latency is the time from just before the write
// was sent to the moment the watcher read its event; every watcher must see each write of its
// namespace exactly once. watchsan's memory per subscriber is its VmRSS growth with the
// watches open, per watch; the CPU per delivered event is watchsan's over the writes
// (through watchsan) or the apiserver's over the writes minus the same writes with no
// watcher (direct), per event delivered to a client.

// ScaleMode is how the watchers of a scale run reach the apiserver.
type ScaleMode string

// The scale modes, in report order.
const (
	// ScaleDirect1: each watch its own TLS connection to the apiserver (HTTP/1.1).
	ScaleDirect1 ScaleMode = "direct-http1"
	// ScaleDirect2: 100 watches a TLS connection to the apiserver (HTTP/2).
	ScaleDirect2 ScaleMode = "direct-http2"
	// ScaleWatchsan1: each watch its own plain connection to watchsan lending a kubeconfig's
	// identity, --share-watches (the node-local proxy).
	ScaleWatchsan1 ScaleMode = "watchsan-http1"
	// ScaleWatchsan2: 100 watches a TLS connection to watchsan --no-credentials
	// --share-watches, every watcher with the same token (a frontend whose clients are one
	// principal, such as every node's kube-proxy).
	ScaleWatchsan2 ScaleMode = "watchsan-http2"
)

// ScaleModes lists the modes in report order.
var ScaleModes = []ScaleMode{ScaleDirect1, ScaleDirect2, ScaleWatchsan1, ScaleWatchsan2}

var scaleDescription = map[ScaleMode]string{
	ScaleDirect1:   "each watch its own TLS connection (HTTP/1.1) to the apiserver",
	ScaleDirect2:   "100 watches a TLS connection (HTTP/2) to the apiserver",
	ScaleWatchsan1: "watchsan --kubeconfig --share-watches, each watch its own plain HTTP/1.1 connection, no token (node-local)",
	ScaleWatchsan2: "watchsan --no-credentials --share-watches with TLS, 100 watches a connection (HTTP/2), one token for all (frontend)",
}

// scaleStreamsPerConn is how many watches share one HTTP/2 connection.
const scaleStreamsPerConn = 100

// ScaleSample is one scale run.
type ScaleSample struct {
	Mode                    ScaleMode
	Watchers, Feeds, Writes int
	// UpstreamWatches is the apiserver's open WATCH requests of configmaps with the watches
	// open, minus before.
	UpstreamWatches float64
	// APIServerTicks is the apiserver's CPU (10 ms ticks) from the first write until every
	// watcher had every write of its namespace, BaselineTicks the same writes' with no watcher.
	APIServerTicks, BaselineTicks int64
	// WatchsanCPU is watchsan's CPU seconds over the same span (0 direct); its VmRSS before
	// the watches opened and with them open, KiB.
	WatchsanCPU                          float64
	WatchsanRSSBeforeKiB, WatchsanRSSKiB int64
	// Delivered is the events of the writes read by the watchers (a write's namespace's
	// watchers each read it once); P50, P99 and Max their delivery latencies.
	Delivered     int
	P50, P99, Max time.Duration
	// Opened is how long opening every watch took, Span from the first write until the last
	// delivery.
	Opened, Span time.Duration
	// Short: watchers that missed a write; Duplicated: that read one twice.
	Short, Duplicated int
	Err               string
}

// KiBPerSubscriber is watchsan's VmRSS growth per watch (0 direct).
func (s *ScaleSample) KiBPerSubscriber() float64 {
	if s.Watchers == 0 || s.WatchsanRSSKiB == 0 {
		return 0
	}
	return float64(s.WatchsanRSSKiB-s.WatchsanRSSBeforeKiB) / float64(s.Watchers)
}

// CPUPerEventUs is the CPU per delivered event, µs: watchsan's through watchsan, the
// apiserver's over its baseline direct.
func (s *ScaleSample) CPUPerEventUs() float64 {
	if s.Delivered == 0 {
		return 0
	}
	cpu := s.WatchsanCPU
	if s.Mode == ScaleDirect1 || s.Mode == ScaleDirect2 {
		cpu = float64(max(0, s.APIServerTicks-s.BaselineTicks)) / clockTicks
	}
	return cpu * 1e6 / float64(s.Delivered)
}

// ScaleEnv is a running cluster set up for scale runs: Feeds namespaces, a ServiceAccount
// allowed to watch configmaps in all of them, and one token of it.
type ScaleEnv struct {
	*FanOutEnv
	Feeds      int
	namespaces []string
	token      string
	// certFile and keyFile are a serving certificate for watchsan's TLS listener (127.0.0.1),
	// pool the clients' roots: the cluster's CA and that certificate.
	certFile, keyFile string
	pool              *x509.CertPool
}

// NewScaleEnv creates `feeds` namespaces in c and the ServiceAccount and token the watchers use.
func NewScaleEnv(ctx context.Context, c *cluster.Cluster, feeds int) (*ScaleEnv, error) {
	fe, err := NewFanOutEnv(ctx, c, "scale", 1)
	if err != nil {
		return nil, err
	}
	e := &ScaleEnv{FanOutEnv: fe, Feeds: feeds, token: fe.Tokens[0]}
	if _, err := fe.admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "scale-cm-watcher"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if _, err := fe.admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "scale-cm-watchers"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "scale-cm-watcher"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "scale", Name: "fanout"}}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	e.namespaces = make([]string, feeds)
	for i := range e.namespaces {
		e.namespaces[i] = fmt.Sprintf("scale-%03d", i)
	}
	if err := parallel(ctx, feeds, 10, func(i int) error {
		_, err := fe.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.namespaces[i]}}, metav1.CreateOptions{})
		return err
	}); err != nil {
		return nil, err
	}
	crt, key, err := cert.GenerateSelfSignedCertKey("127.0.0.1", nil, nil)
	if err != nil {
		return nil, err
	}
	e.certFile, e.keyFile = filepath.Join(c.Dir, "scale-watchsan.crt"), filepath.Join(c.Dir, "scale-watchsan.key")
	if err := os.WriteFile(e.certFile, crt, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(e.keyFile, key, 0o600); err != nil {
		return nil, err
	}
	e.pool = x509.NewCertPool()
	if !e.pool.AppendCertsFromPEM(c.CAData) || !e.pool.AppendCertsFromPEM(crt) {
		return nil, errors.New("scale: no certificate in the cluster's CA or watchsan's")
	}
	return e, nil
}

// ScaleArgs are watchsan's flags for mode m (nil for the direct modes).
func (e *ScaleEnv) ScaleArgs(m ScaleMode) []string {
	switch m {
	case ScaleWatchsan1:
		return []string{"--kubeconfig", e.LentKubeconfig, "--share-watches"}
	case ScaleWatchsan2:
		return []string{"--upstream", e.Cluster.APIServers[0].URL, "--upstream-ca-file", e.Cluster.CAFile, "--no-credentials",
			"--share-watches", "--tls-cert-file", e.certFile, "--tls-private-key-file", e.keyFile}
	}
	return nil
}

// scaleWatcher is one watch of a scale run.
type scaleWatcher struct {
	ns   int
	got  atomic.Int32
	dup  bool
	lats []time.Duration
}

// read reads a JSON watch stream until it ends: the ADDED events of objects named
// prefix<i>, i < len(sent), with their latency from sent[i] (Unix ns).
func (w *scaleWatcher) read(r io.Reader, prefix []byte, sent []atomic.Int64) {
	seen := map[int]bool{}
	br := bufio.NewReaderSize(r, 4<<10)
	key := append([]byte(`"name":"`), prefix...)
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			for errors.Is(err, bufio.ErrBufferFull) { // a long event: none of ours
				_, err = br.ReadSlice('\n')
			}
			continue
		}
		if err != nil {
			return
		}
		now := time.Now()
		j := bytes.Index(line, key)
		if j < 0 || !bytes.Contains(line[:min(len(line), 24)], []byte(`"ADDED"`)) {
			continue
		}
		rest := line[j+len(key):]
		end := bytes.IndexByte(rest, '"')
		i, err := strconv.Atoi(string(rest[:max(end, 0)]))
		if end < 0 || err != nil || i < 0 || i >= len(sent) {
			continue
		}
		if seen[i] {
			w.dup = true
			continue
		}
		seen[i] = true
		w.lats = append(w.lats, now.Sub(time.Unix(0, sent[i].Load())))
		w.got.Add(1)
	}
}

// Measure opens n watches through t (spread evenly over the namespaces), writes `writes`
// configmaps round-robin over them, and waits until every watcher had every write of its
// namespace (or timeout).
func (e *ScaleEnv) Measure(ctx context.Context, m ScaleMode, t FanOutTarget, n, writes int, timeout time.Duration) (s ScaleSample) {
	s = ScaleSample{Mode: m, Watchers: n, Feeds: e.Feeds, Writes: writes}
	fail := func(err error) ScaleSample { s.Err = err.Error(); return s }
	seq := e.seq.Add(1)
	prefix := fmt.Sprintf("sc%d-", seq)
	base, err := e.upstreamWatches(ctx)
	if err != nil {
		return fail(err)
	}
	if s.BaselineTicks, err = e.baseline(ctx, fmt.Sprintf("scb%d-", seq), writes); err != nil {
		return fail(err)
	}
	list, err := e.admin.CoreV1().ConfigMaps("scale").List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return fail(err)
	}
	if t.PID != 0 {
		s.WatchsanRSSBeforeKiB, _ = procStatus(t.PID, "VmRSS")
	}
	// The transports: one for every HTTP/1.1 watch, one per 100 watches over HTTP/2.
	h2 := m == ScaleDirect2 || m == ScaleWatchsan2
	tlsConf := &tls.Config{RootCAs: e.pool}
	var transports []*http.Transport
	rtFor := func(i int) *http.Transport {
		k := 0
		if h2 {
			k = i / scaleStreamsPerConn
		}
		return transports[k]
	}
	nt := 1
	if h2 {
		nt = (n + scaleStreamsPerConn - 1) / scaleStreamsPerConn
	}
	for range nt {
		tr := &http.Transport{MaxIdleConnsPerHost: -1}
		if m != ScaleWatchsan1 {
			tr.TLSClientConfig = tlsConf.Clone()
		}
		tr.ForceAttemptHTTP2 = h2
		transports = append(transports, tr)
	}
	sent := make([]atomic.Int64, writes)
	wctx, stop := context.WithCancel(ctx)
	watchers := make([]*scaleWatcher, n)
	var wg sync.WaitGroup
	defer func() {
		stop()
		wg.Wait()
		for _, tr := range transports {
			tr.CloseIdleConnections()
		}
		if t.Stop != nil {
			t.Stop()
		}
		e.waitUpstreamBack(ctx, base, 60*time.Second)
	}()
	start := time.Now()
	err = parallel(ctx, n, 32, func(i int) error {
		w := &scaleWatcher{ns: i % e.Feeds}
		u := fmt.Sprintf("%s/api/v1/namespaces/%s/configmaps?watch=true&allowWatchBookmarks=true&resourceVersion=%s", t.URL, e.namespaces[w.ns], list.ResourceVersion)
		req, _ := http.NewRequestWithContext(wctx, http.MethodGet, u, nil)
		if m != ScaleWatchsan1 {
			req.Header.Set("Authorization", "Bearer "+e.token)
		}
		resp, err := rtFor(i).RoundTrip(req)
		if err != nil {
			return fmt.Errorf("watch %d: %w", i, err)
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			resp.Body.Close()
			return fmt.Errorf("watch %d: %s %s", i, resp.Status, b)
		}
		if h2 && resp.ProtoMajor != 2 {
			resp.Body.Close()
			return fmt.Errorf("watch %d: answered over %s, want HTTP/2", i, resp.Proto)
		}
		watchers[i] = w
		wg.Add(1)
		go func() { // ends with wctx
			defer wg.Done()
			defer resp.Body.Close()
			w.read(resp.Body, []byte(prefix), sent)
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
	if t.PID != 0 {
		s.WatchsanRSSKiB, _ = procStatus(t.PID, "VmRSS")
	}
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
	if err := e.writeSpread(ctx, prefix, writes, sent); err != nil {
		return fail(fmt.Errorf("writing: %w", err))
	}
	want := make([]int32, e.Feeds) // writes per namespace
	for i := range writes {
		want[i%e.Feeds]++
	}
	all := func() bool {
		for _, w := range watchers {
			if w.got.Load() < want[w.ns] {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(timeout); !all() && time.Now().Before(deadline) && ctx.Err() == nil; {
		sleepCtx(ctx, 5*time.Millisecond)
	}
	s.Span = time.Since(start)
	t1, err := e.apiserverTicks()
	if err != nil {
		return fail(err)
	}
	s.APIServerTicks = t1 - t0
	if t.PID != 0 {
		cpu1, _ := procCPU(t.PID)
		s.WatchsanCPU = cpu1 - cpu0
	}
	stop()
	wg.Wait()
	var lats []time.Duration
	for _, w := range watchers {
		if w.got.Load() < want[w.ns] {
			s.Short++
		}
		if w.dup {
			s.Duplicated++
		}
		lats = append(lats, w.lats...)
	}
	s.Delivered = len(lats)
	if len(lats) > 0 {
		slices.Sort(lats)
		s.P50, s.P99, s.Max = lats[len(lats)/2], lats[min(len(lats)-1, len(lats)*99/100)], lats[len(lats)-1]
	}
	if s.Short+s.Duplicated > 0 {
		s.Err = fmt.Sprintf("of %d watchers %d missed writes (within %v), %d read one twice", n, s.Short, timeout, s.Duplicated)
	}
	return s
}

// writeSpread creates n configmaps named prefix<i>, configmap i in namespace i%Feeds, 10 at
// a time, sent[i] the time just before it is sent (Unix ns).
func (e *ScaleEnv) writeSpread(ctx context.Context, prefix string, n int, sent []atomic.Int64) error {
	return parallel(ctx, n, 10, func(i int) error {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: prefix + strconv.Itoa(i)}, Data: map[string]string{"i": strconv.Itoa(i)}}
		if sent != nil {
			sent[i].Store(time.Now().UnixNano())
		}
		_, err := e.admin.CoreV1().ConfigMaps(e.namespaces[i%e.Feeds]).Create(ctx, cm, metav1.CreateOptions{})
		return err
	})
}

// baseline is the apiserver's CPU ticks for the same writes with no watcher of them.
func (e *ScaleEnv) baseline(ctx context.Context, prefix string, writes int) (int64, error) {
	e.settle(ctx)
	t0, err := e.apiserverTicks()
	if err != nil {
		return 0, err
	}
	if err := e.writeSpread(ctx, prefix, writes, nil); err != nil {
		return 0, err
	}
	t1, err := e.apiserverTicks()
	return t1 - t0, err
}

// ScaleResult is the scale runs at one number of watchers, one sample per mode.
type ScaleResult struct {
	Watchers, Feeds, Writes int
	Samples                 []ScaleSample
}

// Of is mode m's sample, nil when it did not run.
func (r *ScaleResult) Of(m ScaleMode) *ScaleSample {
	for i := range r.Samples {
		if r.Samples[i].Mode == m {
			return &r.Samples[i]
		}
	}
	return nil
}

// scaleWatchers is how many watches mode m can hold at n: an HTTP/1.1 watch through watchsan
// is two of its open files (config.FitConnections), so its watchers are capped as the memory
// section's are.
func scaleWatchers(m ScaleMode, n int) int {
	if m == ScaleWatchsan1 || m == ScaleDirect1 {
		return min(n, watchsanMaxConn()-100)
	}
	return n
}

// scale is the bench's scale phase: a cluster of its own, then for each number of watchers
// every mode, watchsan a fresh process for each.
func (r *runner) scale(ctx context.Context) {
	c, err := cluster.Start(ctx, cluster.Options{})
	if err != nil {
		r.fail("scale: starting kube-apiserver and etcd (make cluster-bins): %v", err)
		return
	}
	defer c.Stop()
	cfg := r.cfg
	e, err := NewScaleEnv(ctx, c, cfg.ScaleFeeds)
	if err != nil {
		r.fail("scale: %v", err)
		return
	}
	defer e.Close()
	r.res.ScaleAPIServer = apiserverVersion(ctx, e.FanOutEnv)
	r.progress("scale      cluster up, %d namespaces", cfg.ScaleFeeds)
	for _, n := range cfg.ScaleWatchers {
		sr := &ScaleResult{Watchers: n, Feeds: cfg.ScaleFeeds, Writes: cfg.ScaleWrites}
		r.res.Scale = append(r.res.Scale, sr)
		timeout := 60*time.Second + time.Duration(n)*10*time.Millisecond
		for _, m := range ScaleModes {
			if ctx.Err() != nil {
				return
			}
			t := FanOutTarget{URL: c.APIServers[0].URL}
			if args := e.ScaleArgs(m); args != nil {
				p, err := cfg.Launcher.startFanOut(ctx, args)
				if err != nil {
					r.fail("scale %s: %v", m, err)
					continue
				}
				t.URL, t.PID, t.AdminURL, t.Stop = p.url, p.pid, p.admin, p.stop
			}
			s := e.Measure(ctx, m, t, scaleWatchers(m, n), cfg.ScaleWrites, timeout)
			sr.Samples = append(sr.Samples, s)
			r.progress("scale      %-16s %5d watchers: upstream watches %5.0f, delivered %d p50 %v p99 %v max %v, apiserver %d ticks (baseline %d), %.1f µs CPU/event, %.1f KiB/sub %s",
				m, s.Watchers, s.UpstreamWatches, s.Delivered, s.P50.Round(time.Millisecond), s.P99.Round(time.Millisecond), s.Max.Round(time.Millisecond),
				s.APIServerTicks, s.BaselineTicks, s.CPUPerEventUs(), s.KiBPerSubscriber(), s.Err)
		}
	}
}

// writeScale is the scale section of the report.
func writeScale(p func(string, ...any), r *Results) {
	p("## Scale: many watchers over many feeds on a real kube-apiserver")
	p("")
	p("W watchers spread evenly over %d namespaces' configmaps (one shared feed each through watchsan), then %d",
		r.Scale[0].Feeds, r.Scale[0].Writes)
	p("configmaps written round-robin over the namespaces (10 writers), on a kube-apiserver %s and etcd of", orDash(r.ScaleAPIServer))
	p("their own (test/cluster). Latency: from just before a write is sent until a watcher of its namespace")
	p("read it, over every (write, watcher) pair. CPU per delivered event: watchsan's over the writes")
	p("(through watchsan), the apiserver's over the writes minus the same writes with no watcher (direct).")
	p("Memory per subscriber: watchsan's VmRSS growth with the watches open, per watch. HTTP/1.1 rows")
	p("hold at most what watchsan's open-file limit allows (two files a connection). Every watcher must")
	p("read every write of its namespace exactly once (checked).")
	if e := r.ScaleEnv; e != nil {
		p("%s", takenApart("scale", e))
	}
	p("")
	p("![scale](scale.png)")
	p("")
	for _, m := range ScaleModes {
		p("- `%s`: %s", m, scaleDescription[m])
	}
	p("")
	p("| watchers | path | upstream watches | delivered | p50 | p99 | max | CPU per event | watchsan memory per subscriber | apiserver ticks (baseline) | checked |")
	p("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, sr := range r.Scale {
		for i := range sr.Samples {
			s := &sr.Samples[i]
			mem := "—"
			if s.WatchsanRSSKiB > 0 {
				mem = fmt.Sprintf("%.1f KiB", s.KiBPerSubscriber())
			}
			check := "every write once"
			if s.Err != "" {
				check = "error: " + oneLine(s.Err)
			}
			p("| %d | %s | %.0f | %d | %s | %s | %s | %.1f µs | %s | %d (%d) | %s |", s.Watchers, s.Mode, s.UpstreamWatches, s.Delivered,
				fmtDur(s.P50), fmtDur(s.P99), fmtDur(s.Max), s.CPUPerEventUs(), mem, s.APIServerTicks, s.BaselineTicks, check)
		}
	}
	p("")
}

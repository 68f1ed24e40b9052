// Package demo runs the incident watchsan exists for (docs/design.md section 1a: Kubernetes
// 1.7.0-1.9.2 sent DELETED watch events with the object's previous resourceVersion;
// kubernetes#58545) end to end, in one process, and reports it for a person.
//
// An upstream with the bug: an apiserver (in-memory by default, or a real kube-apiserver from
// the test harness) behind the fault layer of internal/faults, which sends every DELETED event
// back in time and ends the watch right after it, as a reflector's periodic re-watch would, only
// now. Two real client-go shared informers watch services: one reads the faulty upstream
// directly, the other reads it through watchsan, running in-process. The reproduction from the
// incident write-up then runs (create a, create others, delete a, the watch is re-established,
// then a marker object so both informers are known to have caught up), while a third, plain
// watch on the apiserver itself (no faults) records the truth. Run returns what each
// informer's event handlers saw, judged against that truth, and watchsan's counters.
package demo

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/watchsan/watchsan/internal/config"
	"github.com/watchsan/watchsan/internal/faults"
	"github.com/watchsan/watchsan/internal/logging"
	"github.com/watchsan/watchsan/internal/server"
)

// Options configure a run. The zero value runs the embedded demo with three other objects.
type Options struct {
	// Real runs against a real kube-apiserver and etcd from the test harness (test/cluster),
	// whose binaries must be cached; zero: the in-memory apiserver (internal/memapi).
	Real bool

	// Objects is how many objects are created after a and before its delete (b, c, ...); their
	// events are what the direct informer gets replayed. Zero means 3.
	Objects int

	// Timeout bounds the whole run. Zero means 30 s, or 3 min with Real (the control plane
	// starts first).
	Timeout time.Duration

	// Log receives the components' logs (watchsan, the fault layer, the apiserver stand-in,
	// client-go's reflectors). Nil: discarded.
	Log *zap.Logger
}

// Namespace is where the demo's objects live.
const Namespace = "watchsan-demo"

// markerName names the object created last: once an informer saw it, it saw everything before.
const markerName = "marker"

const defaultObjects = 3

// Run runs the demo and returns what it observed. An error means the demo could not run (the
// environment failed), not that it showed the wrong thing: for that, see Result.Problems.
func Run(ctx context.Context, o Options) (*Result, error) {
	log := o.Log
	if log == nil {
		log = zap.NewNop()
	}
	log = log.Named("demo")
	n := o.Objects
	if n <= 0 {
		n = defaultObjects
	}
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
		if o.Real {
			timeout = 3 * time.Minute
		}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// client-go's reflectors log through the context's logger.
	ctx = klog.NewContext(ctx, logging.Logr(log))
	began := time.Now()

	var (
		up  *upstream
		err error
	)
	if o.Real {
		up, err = startReal(ctx, log)
	} else {
		up, err = startEmbedded(log)
	}
	if err != nil {
		return nil, err
	}
	defer up.stop()

	// One fault layer per client: EndWatchAfterDelete fires once per deleted object per layer.
	buggy := faults.Faults{DeleteOldRV: true, EndWatchAfterDelete: true}
	directLayer := faults.New(up.handler, log.Named("direct"))
	sanLayer := faults.New(up.handler, log.Named("to-watchsan"))
	for _, l := range []*faults.Layer{directLayer, sanLayer} {
		if err := l.Set(buggy); err != nil {
			return nil, fmt.Errorf("setting the faults: %w", err)
		}
	}
	directURL, stopDirect, err := serve(directLayer, log)
	if err != nil {
		return nil, err
	}
	defer stopDirect()
	sanUpstreamURL, stopSanUpstream, err := serve(sanLayer, log)
	if err != nil {
		return nil, err
	}
	defer stopSanUpstream()

	ws, err := startWatchsan(ctx, sanUpstreamURL, log)
	if err != nil {
		return nil, err
	}
	defer ws.stop()

	truthCS, err := kubernetes.NewForConfig(up.config)
	if err != nil {
		return nil, fmt.Errorf("client for the apiserver: %w", err)
	}
	if o.Real {
		_, err := truthCS.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("creating namespace %s: %w", Namespace, err)
		}
	}

	// The truth: a plain watch on the apiserver itself, from before the first write.
	start, err := truthCS.CoreV1().Services(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing services: %w", err)
	}
	truth, err := watchTruth(ctx, truthCS, start.ResourceVersion)
	if err != nil {
		return nil, err
	}
	defer truth.stop()

	direct, err := startInformer(ctx, directURL)
	if err != nil {
		return nil, err
	}
	defer direct.stop()
	through, err := startInformer(ctx, ws.url)
	if err != nil {
		return nil, err
	}
	defer through.stop()
	for name, inf := range map[string]*informer{"direct": direct, "through watchsan": through} {
		if !cache.WaitForCacheSync(ctx.Done(), inf.informer.HasSynced) {
			return nil, fmt.Errorf("the %s informer did not sync: %w", name, context.Cause(ctx))
		}
	}

	// The reproduction (kubernetes#58545).
	svcs := truthCS.CoreV1().Services(Namespace)
	if _, err := svcs.Create(ctx, service("a"), metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating a: %w", err)
	}
	others := otherNames(n)
	for _, name := range others {
		if _, err := svcs.Create(ctx, service(name), metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("creating %s: %w", name, err)
		}
	}
	b, err := svcs.Get(ctx, others[0], metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", others[0], err)
	}
	b.Labels = map[string]string{"revision": "2"}
	if _, err := svcs.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("updating %s: %w", b.Name, err)
	}
	// A write to another resource: resourceVersions are global, and a busy cluster writes
	// between any two service events.
	cm, err := truthCS.CoreV1().ConfigMaps(Namespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "other-traffic"}, Data: map[string]string{"x": "1"},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating a configmap: %w", err)
	}
	other := Write{Type: "ADDED", Name: "configmap/" + cm.Name, RV: cm.ResourceVersion}
	if err := svcs.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		return nil, fmt.Errorf("deleting a: %w", err)
	}
	// The fault layers end both watches after the delete; wait until both were re-established
	// (by the direct informer's reflector, and by watchsan resuming upstream).
	for name, l := range map[string]*faults.Layer{"direct": directLayer, "watchsan's": sanLayer} {
		if err := waitFor(ctx, func() bool { st := l.Stats(); return st.EndedAfterDelete >= 1 && st.Watches >= 2 }); err != nil {
			return nil, fmt.Errorf("the %s watch was not ended and re-established after the delete: %w", name, err)
		}
	}
	if _, err := svcs.Create(ctx, service(markerName), metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating the marker: %w", err)
	}
	for name, seen := range map[string]func() bool{
		"the direct informer":           func() bool { return direct.rec.sawAdd(markerName) },
		"the informer through watchsan": func() bool { return through.rec.sawAdd(markerName) },
		"the truth watch":               func() bool { return truth.saw(markerName) },
	} {
		if err := waitFor(ctx, seen); err != nil {
			return nil, fmt.Errorf("%s did not see the marker object: %w", name, err)
		}
	}

	final, err := svcs.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing services at the end: %w", err)
	}
	res := &Result{
		Upstream: up.name,
		Deleted:  "a",
		Truth:    truth.events(),
		Other:    []Write{other},
		Faults:   [2]faults.Stats{directLayer.Stats(), sanLayer.Stats()},
	}
	res.Direct = judge("client-go -> apiserver with the bug", direct, res.Truth)
	res.Through = judge("client-go -> watchsan -> apiserver with the bug", through, res.Truth)
	res.Direct.compareStore(direct.informer.GetStore(), final.Items)
	res.Through.compareStore(through.informer.GetStore(), final.Items)

	// watchsan counts a stream that needed repairs when it ends: end the informer's watch
	// and wait until watchsan has no watch open.
	through.stop()
	if err := waitFor(ctx, func() bool { return openWatches(ws.srv) == 0 }); err != nil {
		return nil, fmt.Errorf("watchsan's watches did not end after the informer stopped: %w", err)
	}
	res.Counters = readCounters(ws.srv)
	res.Elapsed = time.Since(began)
	return res, nil
}

// upstream is the apiserver under the fault layers: handler reaches it (with credentials);
// config reaches it directly for the demo's own writes and the truth watch.
type upstream struct {
	name    string
	handler http.Handler
	config  *rest.Config
	stop    func()
}

// serve serves h on a free loopback port until stop.
func serve(h http.Handler, log *zap.Logger) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("listening on loopback: %w", err)
	}
	srv := &http.Server{Handler: h, ErrorLog: zap.NewStdLog(log.Named("http")), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	stop = func() {
		// Close, not Shutdown: open watches are cut, as when an apiserver goes away.
		_ = srv.Close()
		<-done
	}
	return "http://" + ln.Addr().String(), stop, nil
}

// watchsanProc is watchsan running in-process.
type watchsanProc struct {
	srv  *server.Server
	url  string
	stop func()
}

func startWatchsan(ctx context.Context, upstreamURL string, log *zap.Logger) (*watchsanProc, error) {
	cfg := config.Default()
	cfg.Upstreams = []string{upstreamURL}
	cfg.Listen = "127.0.0.1:0"
	// config.Validate refuses two equal addresses, "127.0.0.1:0" twice included.
	cfg.AdminListen = "localhost:0"
	cfg.LogLevel = "error"
	cfg.ShutdownTimeout = 2 * time.Second
	completed, err := cfg.Complete()
	if err != nil {
		return nil, fmt.Errorf("watchsan's configuration: %w", err)
	}
	srv, err := server.New(completed, log.Named("watchsan"))
	if err != nil {
		return nil, fmt.Errorf("starting watchsan: %w", err)
	}
	addrs := make(chan net.Addr, 1)
	srv.Listening = func(main, _ net.Addr) { addrs <- main }
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	errc := make(chan error, 1)
	go func() { errc <- srv.Run(runCtx) }()
	stop := func() {
		cancel()
		<-errc
	}
	select {
	case a := <-addrs:
		return &watchsanProc{srv: srv, url: "http://" + a.String(), stop: stop}, nil
	case err := <-errc:
		cancel()
		return nil, fmt.Errorf("watchsan stopped at once: %w", err)
	case <-ctx.Done():
		stop()
		return nil, fmt.Errorf("waiting for watchsan to listen: %w", context.Cause(ctx))
	}
}

// informer is a shared informer on the demo's services with a recorder of its handler calls.
type informer struct {
	informer cache.SharedIndexInformer
	rec      *recorder
	stop     func()
}

func startInformer(ctx context.Context, host string) (*informer, error) {
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: host, QPS: -1})
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", host, err)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(Namespace))
	inf := factory.Core().V1().Services().Informer()
	rec := &recorder{}
	if _, err := inf.AddEventHandler(rec.handlers()); err != nil {
		return nil, fmt.Errorf("adding the event handlers: %w", err)
	}
	infCtx, cancel := context.WithCancel(ctx)
	factory.StartWithContext(infCtx)
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); factory.Shutdown() }) }
	return &informer{informer: inf, rec: rec, stop: stop}, nil
}

func service(name string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}
}

// otherNames returns n object names after "a": b, c, ... then o-27, o-28, ...
func otherNames(n int) []string {
	names := make([]string, 0, n)
	for i := range n {
		if i < 25 {
			names = append(names, string(rune('b'+i)))
		} else {
			names = append(names, "o-"+strconv.Itoa(i+2))
		}
	}
	return names
}

// waitFor polls cond until it holds or ctx ends.
func waitFor(ctx context.Context, cond func() bool) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-t.C:
		}
	}
	return nil
}

// truthWatch records the apiserver's own event stream for the demo's services.
type truthWatch struct {
	mu   sync.Mutex
	evs  []Write
	stop func()
}

func watchTruth(ctx context.Context, cs kubernetes.Interface, fromRV string) (*truthWatch, error) {
	w, err := cs.CoreV1().Services(Namespace).Watch(ctx, metav1.ListOptions{ResourceVersion: fromRV})
	if err != nil {
		return nil, fmt.Errorf("watching the apiserver: %w", err)
	}
	t := &truthWatch{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			s, ok := ev.Object.(*corev1.Service)
			if !ok {
				continue
			}
			t.mu.Lock()
			t.evs = append(t.evs, Write{Type: string(ev.Type), Name: s.Name, RV: s.ResourceVersion})
			t.mu.Unlock()
		}
	}()
	t.stop = func() { w.Stop(); <-done }
	return t, nil
}

func (t *truthWatch) events() []Write {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]Write(nil), t.evs...)
}

func (t *truthWatch) saw(name string) bool {
	for _, e := range t.events() {
		if e.Name == name {
			return true
		}
	}
	return false
}

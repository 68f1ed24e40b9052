package e2e

// End-to-end tests of the watch sanitizer against a real kube-apiserver:
//
//	real apiserver <- fault layer (internal/faults, in this process) <- watchsan (the binary)
//	               <- client-go shared informer, its handlers counting every call
//
// The fault layer reproduces the Kubernetes 1.7-1.9 bug (docs/design.md section 1a): DELETED
// events carry the object's previous resourceVersion, and the watch ends right after the
// delete, as the reflector's periodic re-watch would. First the layer is shown to be faithful
// (an informer reading it directly suffers the incident); then the same sequence through
// watchsan must reach the informer exactly as the apiserver meant it, in JSON, protobuf and
// CBOR.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/features"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/watchsan/watchsan/internal/faults"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/test/cluster"
)

// Deadlines. Everything here happens on loopback against a warm apiserver; these only bound a
// failure.
const (
	sanSyncTimeout  = 30 * time.Second
	sanEventTimeout = 30 * time.Second
)

// TestSanitizeFaultLayerIsFaithful: an informer reading the fault layer directly suffers the
// incident of kubernetes#58545. After "create a; create b, c, d; delete a" the watch ends, the
// reflector re-watches from a's stale resourceVersion and the apiserver replays b, c, d and
// the delete: handlers get OnUpdate calls nobody caused and a second OnDelete. If this test
// fails, the fault layer no longer reproduces the bug and the watchsan tests below prove
// nothing.
func TestSanitizeFaultLayerIsFaithful(t *testing.T) {
	e := newSanEnv(t, cluster.Options{})
	for _, cd := range []sanCodec{sanCodecJSON, sanCodecProtobuf} {
		t.Run(cd.name, func(t *testing.T) {
			layer, layerURL := e.faultFront(t, incidentFaults)
			inc := e.runIncident(t, layerURL, cd, layer)

			st := layer.Stats()
			if st.DeletesRewritten < 1 || st.EndedAfterDelete != 1 {
				t.Fatalf("fault layer did not fire: %+v", st)
			}
			// The reflector re-watched from the RV the bug put on the delete: a's creation RV.
			if !inc.wire.watchedFrom(inc.createdRV["a"]) {
				t.Fatalf("no re-watch from a's stale resourceVersion %s; watches: %v", inc.createdRV["a"], inc.wire.requests())
			}
			replayedUpdates := inc.calls.count("update", "b") + inc.calls.count("update", "c") + inc.calls.count("update", "d")
			deletesOfA := inc.calls.count("delete", "a")
			t.Logf("direct informer (%s): %d OnUpdate for b/c/d that the server did not cause, %d OnDelete for a",
				cd.name, replayedUpdates, deletesOfA)
			if replayedUpdates == 0 && deletesOfA < 2 {
				t.Fatalf("the direct informer saw no replay (OnUpdate b/c/d: %d, OnDelete a: %d); calls: %s",
					replayedUpdates, deletesOfA, inc.calls)
			}
			// The same checks that must pass through watchsan catch the damage here; this
			// shows they can fail.
			if v := inc.wire.violations(); len(v) == 0 {
				t.Fatal("the wire check found no regressing resourceVersion in a stream the fault layer broke")
			} else {
				t.Logf("wire check found, as it must: %s", strings.Join(v, "; "))
			}
			if v := inc.calls.violations(inc.deleted); len(v) == 0 {
				t.Fatal("the handler check found nothing wrong with a broken stream")
			}
			for _, w := range inc.wire.watchList() {
				if w.format != cd.format {
					t.Fatalf("watch answered in %s, want %s", w.format, cd.format)
				}
			}
		})
	}
}

// TestSanitizeThroughWatchsan: the incident's sequence through watchsan. The informer must see
// exactly what the apiserver did: no resourceVersion going backwards on the wire or in its
// handlers, one OnAdd per created object, no OnUpdate (no update was made), one OnDelete for
// the deleted one, and a store equal to a fresh list; and watchsan's metrics must show that it
// rewrote the delete (a watchsan that passed the stream through would fail here) and dropped
// the replayed one.
//
// The apiserver serves CBOR (CBORServingAndStorage) so all three formats run against one
// control plane. "no-resume" legs end the client's watch when the upstream's ends, so the
// informer itself re-watches from the resourceVersion watchsan gave it (the incident's path,
// through the cross-re-watch delete memory); the "resume" leg lets watchsan splice the
// upstream re-watch into the same client stream. The "observe" leg is the control: with
// --fix-mode=observe watchsan changes nothing, and the same checks must find the damage.
func TestSanitizeThroughWatchsan(t *testing.T) {
	e := newSanEnv(t, cluster.Options{FeatureGates: "CBORServingAndStorage=true"})
	legs := []struct {
		name    string
		cd      sanCodec
		args    []string
		observe bool
		resume  bool
	}{
		{"json/no-resume", sanCodecJSON, []string{"--disable-watch-resume"}, false, false},
		{"protobuf/no-resume", sanCodecProtobuf, []string{"--disable-watch-resume"}, false, false},
		{"cbor/no-resume", sanCodecCBOR, []string{"--disable-watch-resume"}, false, false},
		{"json/resume", sanCodecJSON, nil, false, true},
		{"protobuf/resume", sanCodecProtobuf, nil, false, true},
		{"json/observe-control", sanCodecJSON, []string{"--disable-watch-resume", "--fix-mode=observe"}, true, false},
	}
	for _, leg := range legs {
		t.Run(leg.name, func(t *testing.T) {
			if leg.cd.format == stream.CBOR {
				enableCBORClients(t)
			}
			layer, layerURL := e.faultFront(t, incidentFaults)
			p := startProxy(t, append([]string{"--upstream=" + layerURL}, leg.args...)...)
			inc := e.runIncident(t, p.URL, leg.cd, layer)

			if st := layer.Stats(); st.DeletesRewritten < 1 || st.EndedAfterDelete != 1 {
				t.Fatalf("fault layer did not fire: %+v", st)
			}
			for _, w := range inc.wire.watchList() {
				if w.format != leg.cd.format {
					t.Fatalf("watch answered in %s (%s), want %s", w.format, w.contentType, leg.cd.format)
				}
			}
			var problems []string
			problems = append(problems, inc.wire.violations()...)
			problems = append(problems, inc.calls.violations(inc.deleted)...)
			problems = append(problems, e.storeVsList(t, inc)...)

			if leg.observe {
				// Control: watchsan only watched, so the checks must see the incident.
				if len(problems) == 0 {
					t.Fatalf("with --fix-mode=observe the checks found nothing: they cannot tell a repaired stream from a broken one; calls: %s", inc.calls)
				}
				t.Logf("observe mode, as expected, let through: %s", strings.Join(problems, "; "))
				// Observe only counts what repair would have done.
				if n := p.Metric("watchsan_watch_events_total", map[string]string{"type": "DELETED", "action": "rewritten"}); n < 1 {
					t.Fatalf("observe mode counted %v DELETED events it would rewrite, want at least 1", n)
				}
				return
			}
			if len(problems) > 0 {
				t.Fatalf("through watchsan the informer saw:\n  %s\nhandler calls: %s\nwatches: %v",
					strings.Join(problems, "\n  "), inc.calls, inc.wire.requests())
			}
			rewritten := p.Metric("watchsan_watch_events_total", map[string]string{"type": "DELETED", "action": "rewritten"})
			dropped := p.Metric("watchsan_watch_events_total", map[string]string{"type": "DELETED", "action": "dropped"})
			if rewritten < 1 {
				t.Fatalf("watchsan_watch_events_total{type=DELETED,action=rewritten} = %v: watchsan did not repair the delete", rewritten)
			}
			// The re-watch (the client's, or watchsan's resume) starts below the delete's real
			// revision whenever watchsan rewrote the delete to an RV under it, as the unrelated
			// write makes likely; the layer then sends the delete again (DeletesRewritten 2),
			// and only watchsan's memory of it keeps it from the client.
			if st := layer.Stats(); st.DeletesRewritten >= 2 && dropped < 1 {
				t.Fatalf("the layer sent the delete again (%+v) but watchsan_watch_events_total{type=DELETED,action=dropped} = %v", st, dropped)
			}
			if ws := inc.wire.watchList(); leg.resume {
				// watchsan spliced its re-watch into the client's stream: one client watch.
				if n := p.Metric("watchsan_watch_resumes_total", nil); n < 1 || len(ws) != 1 {
					t.Fatalf("resume leg: %v resumes, the client opened %d watches (%v); want a resume and 1 watch", n, len(ws), ws)
				}
			} else {
				// The client re-watched through watchsan, from the RV watchsan gave it.
				p.requireProxied(1, map[string]string{"verb": "watch", "resource": "configmaps"})
				if len(ws) < 2 {
					t.Fatalf("no-resume leg: the client opened %d watches (%v), want a re-watch", len(ws), ws)
				}
			}
			t.Logf("%s: the layer sent %d DELETED events back in time; watchsan rewrote %v and dropped %v; the informer saw %s",
				leg.name, layer.Stats().DeletesRewritten, rewritten, dropped, inc.calls)
		})
	}
}

// TestSanitizeWatchListSyncs: a client-go v0.37 informer, which uses watch-list by default
// (sendInitialEvents=true, no LIST), syncs through watchsan: the initial-events-end bookmark
// passes (without it HasSynced never becomes true), the store holds what a fresh list holds,
// and the stream is live afterwards. watchsan talks to the apiserver over HTTPS here, with the
// credentials of a kubeconfig, as in production.
func TestSanitizeWatchListSyncs(t *testing.T) {
	e := newSanEnv(t, cluster.Options{})
	kubeconfig := filepath.Join(t.TempDir(), "direct.kubeconfig")
	if err := e.c.WriteKubeconfig(kubeconfig, e.c.APIServers[0].URL, e.c.AdminToken, e.c.CAFile); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, "--kubeconfig="+kubeconfig)
	for _, cd := range []sanCodec{sanCodecJSON, sanCodecProtobuf} {
		t.Run(cd.name, func(t *testing.T) {
			ctx := ctxT(t, 2*time.Minute)
			ns := e.namespace(t)
			for i := range 3 {
				e.createCM(t, ctx, ns, fmt.Sprintf("pre-%d", i))
			}
			inf := e.startInformer(t, p.URL, cd, ns)
			start := time.Now()
			eventually(t, sanSyncTimeout, "the watch-list informer to sync through watchsan", inf.reg.HasSynced)
			t.Logf("%s watch-list informer synced through watchsan in %v", cd.name, time.Since(start).Round(time.Millisecond))

			ws := inf.wire.watchList()
			if len(ws) == 0 || ws[0].query.Get("sendInitialEvents") != "true" {
				t.Fatalf("the informer did not use watch-list (first watch: %v); requests: %v", ws, inf.wire.requests())
			}
			if !ws[0].sawInitialEventsEnd() {
				t.Fatal("no initial-events-end bookmark reached the client")
			}
			if l := inf.wire.lists(); len(l) > 0 {
				t.Fatalf("the informer sent LIST requests %v: it did not sync by watch-list", l)
			}
			for _, name := range []string{"pre-0", "pre-1", "pre-2"} {
				if n := inf.calls.count("add", name); n != 1 {
					t.Fatalf("%s: %d OnAdd, want 1 (initial events)", name, n)
				}
			}
			// Live after sync.
			e.createCM(t, ctx, ns, "after-sync")
			eventually(t, sanEventTimeout, "OnAdd for after-sync", func() bool { return inf.calls.count("add", "after-sync") == 1 })
			if v := append(inf.wire.violations(), inf.calls.violations(nil)...); len(v) > 0 {
				t.Fatalf("watch-list through watchsan: %s", strings.Join(v, "; "))
			}
			if v := e.storeVsList(t, &incident{ns: ns, inf: inf.inf}); len(v) > 0 {
				t.Fatal(strings.Join(v, "; "))
			}
			// The informer's watch is open through watchsan (a finished request would be in
			// watchsan_requests_total, but this one is still streaming).
			if n := p.Metric("watchsan_open_watches", map[string]string{"resource": "configmaps"}); n < 1 {
				t.Fatalf("watchsan_open_watches{resource=configmaps} = %v: the informer's watch does not go through watchsan", n)
			}
		})
	}
}

// ---------------------------------------------------------------------------------------------
// The environment: a cluster, an admin client, fault layers in front of the apiserver.

// incidentFaults reproduce the 1.7-1.9 watch cache: DELETED with the previous RV, and the
// reflector's re-watch brought forward to right after the delete.
var incidentFaults = faults.Faults{DeleteOldRV: true, EndWatchAfterDelete: true}

type sanEnv struct {
	c     *cluster.Cluster
	admin *kubernetes.Clientset // straight to the apiserver
	nsSeq int
	mu    sync.Mutex
}

func newSanEnv(t *testing.T, o cluster.Options) *sanEnv {
	t.Helper()
	c := newCluster(t, o)
	admin, err := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	return &sanEnv{c: c, admin: admin}
}

// namespace creates a fresh namespace for one leg, so legs sharing a cluster never see each
// other's objects.
func (e *sanEnv) namespace(t *testing.T) string {
	t.Helper()
	e.mu.Lock()
	e.nsSeq++
	ns := fmt.Sprintf("san-%d", e.nsSeq)
	e.mu.Unlock()
	ctx := ctxT(t, 30*time.Second)
	if _, err := e.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace %s: %v", ns, err)
	}
	return ns
}

func (e *sanEnv) createCM(t *testing.T, ctx context.Context, ns, name string) string {
	t.Helper()
	cm, err := e.admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Data:       map[string]string{"k": name},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating configmap %s/%s: %v", ns, name, err)
	}
	return cm.ResourceVersion
}

// faultFront serves a fault layer with f set, in front of a reverse proxy to the apiserver
// that authenticates as the admin, on a loopback httptest server; it returns the layer and
// the server's URL (plain http). The server is closed in t.Cleanup (after whatever the test
// starts later, which is stopped first), and the layer's log is printed if the test failed.
func (e *sanEnv) faultFront(t *testing.T, f faults.Faults) (*faults.Layer, string) {
	t.Helper()
	logw := &sanLogBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fault layer log:\n%s", logw.String())
		}
	})
	target, err := url.Parse(e.c.APIServers[0].URL)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(e.c.CAData) {
		t.Fatal("cluster CA: no certificate")
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}
	token := e.c.AdminToken
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Header.Set("Authorization", "Bearer "+token)
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorLog:      log.New(logw, "reverseproxy: ", 0),
	}
	logger := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.AddSync(logw), zap.DebugLevel))
	layer := faults.New(rp, logger)
	if err := layer.Set(f); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(layer)
	t.Cleanup(func() {
		srv.Close()
		tr.CloseIdleConnections()
	})
	return layer, srv.URL
}

// sanCodec is how a client talks to the apiserver.
type sanCodec struct {
	name        string
	format      stream.Format // what its watches must be answered in
	contentType string
	accept      string
}

var (
	sanCodecJSON     = sanCodec{"json", stream.JSON, runtime.ContentTypeJSON, runtime.ContentTypeJSON}
	sanCodecProtobuf = sanCodec{"protobuf", stream.Protobuf, runtime.ContentTypeProtobuf, runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON}
	sanCodecCBOR     = sanCodec{"cbor", stream.CBOR, runtime.ContentTypeCBOR, runtime.ContentTypeCBOR}
)

// cborClientGates turns on client-go's ClientsAllowCBOR (alpha, off by default), without which
// client-go rewrites a configured application/cbor to JSON.
type cborClientGates struct{ features.Gates }

func (g cborClientGates) Enabled(k features.Feature) bool {
	if k == features.ClientsAllowCBOR {
		return true
	}
	return g.Gates.Enabled(k)
}

// enableCBORClients turns ClientsAllowCBOR on for the rest of the test. The gate is
// process-wide and read per request; clients must be created after this call.
func enableCBORClients(t *testing.T) {
	prev := features.FeatureGates()
	features.ReplaceFeatureGates(cborClientGates{prev})
	t.Cleanup(func() { features.ReplaceFeatureGates(prev) })
}

// sanInformer is a running configmap informer of one namespace, with its handlers' log and a
// record of its traffic.
type sanInformer struct {
	inf   cache.SharedIndexInformer
	reg   cache.ResourceEventHandlerRegistration
	calls *handlerLog
	wire  *wireLog
}

// startInformer runs a client-go shared informer for configmaps in ns through host, speaking
// cd, with no resync; it is stopped in t.Cleanup.
func (e *sanEnv) startInformer(t *testing.T, host string, cd sanCodec, ns string) *sanInformer {
	t.Helper()
	wire := &wireLog{}
	cfg := &rest.Config{Host: host, QPS: 200, Burst: 400}
	cfg.ContentType = cd.contentType
	cfg.AcceptContentTypes = cd.accept
	cfg.Wrap(wire.wrap)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	inf := factory.Core().V1().ConfigMaps().Informer()
	calls := &handlerLog{}
	reg, err := inf.AddEventHandler(calls.handler())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.StartWithContext(ctx)
	t.Cleanup(func() {
		cancel()
		factory.Shutdown()
		if !wire.waitParsers(10 * time.Second) {
			t.Error("a watch body recorder did not finish: a watch response was never closed")
		}
	})
	return &sanInformer{inf: inf, reg: reg, calls: calls, wire: wire}
}

// incident is one run of the reproduction.
type incident struct {
	ns        string
	inf       cache.SharedIndexInformer
	calls     *handlerLog
	wire      *wireLog
	createdRV map[string]string
	deleted   map[string]bool
}

// runIncident runs the reproduction from kubernetes#58545 in a fresh namespace with an
// informer reading host (the fault layer itself or watchsan in front of it): create a; create
// b, c, d; an unrelated write; delete a; wait until the layer ended the watch after the delete
// and the watch was opened again; create a marker and wait for the informer to see it. A
// watch delivers in order, so everything the re-watch replayed has reached the handlers by
// then.
//
// The unrelated write (a Secret, which the configmap watch does not see) puts a revision
// between d's and the delete's, as a busy cluster would, so a client resuming from d's RV + 1
// is sent the delete again.
func (e *sanEnv) runIncident(t *testing.T, host string, cd sanCodec, layer *faults.Layer) *incident {
	t.Helper()
	ctx := ctxT(t, 2*time.Minute)
	ns := e.namespace(t)
	inf := e.startInformer(t, host, cd, ns)
	eventually(t, sanSyncTimeout, "the informer to sync", inf.reg.HasSynced)
	watchesAtSync := layer.Stats().Watches

	inc := &incident{ns: ns, inf: inf.inf, calls: inf.calls, wire: inf.wire,
		createdRV: map[string]string{}, deleted: map[string]bool{"a": true}}
	for _, name := range []string{"a", "b", "c", "d"} {
		inc.createdRV[name] = e.createCM(t, ctx, ns, name)
	}
	if _, err := e.admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "unrelated"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.admin.CoreV1().ConfigMaps(ns).Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, sanEventTimeout, "the fault layer to end the watch after the delete and the watch to be opened again", func() bool {
		st := layer.Stats()
		return st.EndedAfterDelete >= 1 && st.Watches > watchesAtSync
	})
	inc.createdRV["marker"] = e.createCM(t, ctx, ns, "marker")
	eventually(t, sanEventTimeout, "the informer to see the marker", func() bool { return inf.calls.count("add", "marker") >= 1 })
	return inc
}

// storeVsList compares the informer's store with a fresh list from the apiserver, by name and
// resourceVersion.
func (e *sanEnv) storeVsList(t *testing.T, inc *incident) []string {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	list, err := e.admin.CoreV1().ConfigMaps(inc.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, cm := range list.Items {
		want[cm.Name] = cm.ResourceVersion
	}
	got := map[string]string{}
	for _, o := range inc.inf.GetStore().List() {
		cm := o.(*corev1.ConfigMap)
		got[cm.Name] = cm.ResourceVersion
	}
	if fmt.Sprint(got) != fmt.Sprint(want) { // fmt sorts map keys
		return []string{fmt.Sprintf("informer store %v differs from a fresh list %v", got, want)}
	}
	return nil
}

// ---------------------------------------------------------------------------------------------
// What the handlers saw.

type handlerCall struct {
	kind, name, rv string
}

// handlerLog counts an informer's handler calls per kind and object name, and keeps every call
// made after the initial list in order.
type handlerLog struct {
	mu     sync.Mutex
	counts map[string]map[string]int // kind -> name -> calls
	steady []handlerCall
}

func (h *handlerLog) record(kind string, obj any, initial bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.counts == nil {
		h.counts = map[string]map[string]int{}
	}
	if h.counts[kind] == nil {
		h.counts[kind] = map[string]int{}
	}
	h.counts[kind][cm.Name]++
	if !initial {
		h.steady = append(h.steady, handlerCall{kind, cm.Name, cm.ResourceVersion})
	}
}

func (h *handlerLog) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc:    func(obj any, initial bool) { h.record("add", obj, initial) },
		UpdateFunc: func(_, obj any) { h.record("update", obj, false) },
		DeleteFunc: func(obj any) { h.record("delete", obj, false) },
	}
}

func (h *handlerLog) count(kind, name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.counts[kind][name]
}

// violations lists what an informer must not see when the server created every object once,
// updated none, and deleted those in deleted once: other counts, and handler resourceVersions
// that do not strictly increase after the initial list.
func (h *handlerLog) violations(deleted map[string]bool) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	names := map[string]bool{}
	for _, m := range h.counts {
		for n := range m {
			names[n] = true
		}
	}
	for _, n := range sanSortedKeys(names) {
		wantDel := 0
		if deleted[n] {
			wantDel = 1
		}
		if a, u, d := h.counts["add"][n], h.counts["update"][n], h.counts["delete"][n]; a != 1 || u != 0 || d != wantDel {
			out = append(out, fmt.Sprintf("%s: %d OnAdd, %d OnUpdate, %d OnDelete; the server caused 1, 0, %d", n, a, u, d, wantDel))
		}
	}
	var last uint64
	var lastCall handlerCall
	for _, c := range h.steady {
		rv, err := strconv.ParseUint(c.rv, 10, 64)
		if err != nil {
			out = append(out, fmt.Sprintf("On%s(%s) with a non-integer resourceVersion %q", c.kind, c.name, c.rv))
			continue
		}
		if rv <= last {
			out = append(out, fmt.Sprintf("handler resourceVersion went from %d (%s %s) to %d (%s %s)", last, lastCall.kind, lastCall.name, rv, c.kind, c.name))
		}
		if rv > last {
			last, lastCall = rv, c
		}
	}
	return out
}

// String lists the calls per kind and name.
func (h *handlerLog) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	for _, kind := range []string{"add", "update", "delete"} {
		fmt.Fprintf(&b, "%s%v ", kind, h.counts[kind])
	}
	return strings.TrimSpace(b.String())
}

func sanSortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// ---------------------------------------------------------------------------------------------
// What went over the wire: every request the client made, and every event of every watch
// response it read, parsed with package stream as the client read it.

type wireLog struct {
	mu      sync.Mutex
	reqs    []string
	watches []*wireWatch
	parsers sync.WaitGroup
}

type wireWatch struct {
	query       url.Values
	format      stream.Format
	contentType string
	events      []wireEvent
	err         error // a parse error other than the body ending
}

type wireEvent struct {
	typ, rv, name string
	rvInt         uint64
	rvIsInt       bool
	iee           bool
}

func (w *wireWatch) String() string {
	return fmt.Sprintf("watch(rv=%q sendInitialEvents=%q, %d events)", w.query.Get("resourceVersion"), w.query.Get("sendInitialEvents"), len(w.events))
}

func (w *wireWatch) sawInitialEventsEnd() bool {
	for _, e := range w.events {
		if e.iee {
			return true
		}
	}
	return false
}

// wrap is a rest.Config WrapTransport.
func (l *wireLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return sanRoundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		l.mu.Lock()
		l.reqs = append(l.reqs, req.Method+" "+req.URL.RequestURI())
		l.mu.Unlock()
		if err != nil || !reqinfo.Parse(req).IsWatch() || resp.StatusCode != http.StatusOK {
			return resp, err
		}
		format, ok := stream.FormatOf(resp.Header.Get("Content-Type"))
		if !ok {
			return resp, err
		}
		ww := &wireWatch{query: req.URL.Query(), format: format, contentType: resp.Header.Get("Content-Type")}
		l.mu.Lock()
		l.watches = append(l.watches, ww)
		l.mu.Unlock()
		pr, pw := io.Pipe()
		l.parsers.Add(1)
		go l.parse(ww, pr)
		resp.Body = &sanTeeBody{ReadCloser: resp.Body, pw: pw}
		return resp, nil
	})
}

var errSanBodyClosed = errors.New("watch body closed by the client")

// parse reads the copy of a watch body until it ends. It returns once the client closed the
// body or read it to its end (sanTeeBody closes the pipe then).
func (l *wireLog) parse(ww *wireWatch, pr *io.PipeReader) {
	defer l.parsers.Done()
	rd := stream.NewReader(ww.format, pr, 0)
	for {
		ev, err := rd.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, errSanBodyClosed) && !errors.Is(err, io.ErrUnexpectedEOF) {
				l.mu.Lock()
				ww.err = err
				l.mu.Unlock()
			}
			_, _ = io.Copy(io.Discard, pr) // never block the client's reads
			return
		}
		l.mu.Lock()
		ww.events = append(ww.events, wireEvent{typ: ev.Type, rv: ev.RV, name: ev.Name, rvInt: ev.RVInt, rvIsInt: ev.RVIsInt, iee: ev.InitialEventsEnd})
		l.mu.Unlock()
	}
}

func (l *wireLog) waitParsers(d time.Duration) bool {
	done := make(chan struct{})
	go func() { l.parsers.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// sanTeeBody copies what the client reads from a watch body into a pipe.
type sanTeeBody struct {
	io.ReadCloser
	pw *io.PipeWriter
}

func (b *sanTeeBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		_, _ = b.pw.Write(p[:n])
	}
	if err != nil {
		b.pw.CloseWithError(err) // io.EOF: the parser sees a clean end
	}
	return n, err
}

func (b *sanTeeBody) Close() error {
	b.pw.CloseWithError(errSanBodyClosed)
	return b.ReadCloser.Close()
}

type sanRoundTripper func(*http.Request) (*http.Response, error)

func (f sanRoundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// watchList returns a snapshot of the watches so far: copies, safe to read while the parsers
// go on recording.
func (l *wireLog) watchList() []*wireWatch {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*wireWatch, len(l.watches))
	for i, w := range l.watches {
		c := *w
		c.events = append([]wireEvent(nil), w.events...)
		out[i] = &c
	}
	return out
}

func (l *wireLog) requests() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.reqs...)
}

// lists returns the LIST requests (GETs of a collection that are not watches).
func (l *wireLog) lists() []string {
	var out []string
	for _, r := range l.requests() {
		u, _ := url.Parse(strings.TrimPrefix(r, "GET "))
		if strings.HasPrefix(r, "GET ") && strings.HasSuffix(u.Path, "/configmaps") && !strings.Contains(u.RawQuery, "watch=") {
			out = append(out, r)
		}
	}
	return out
}

// watchedFrom reports whether a watch was opened from resourceVersion rv.
func (l *wireLog) watchedFrom(rv string) bool {
	for _, w := range l.watchList() {
		if w.query.Get("resourceVersion") == rv {
			return true
		}
	}
	return false
}

// violations checks the resourceVersions the client received, across all its watches in
// order: after a watch's initial phase (from RV "" or "0", or sendInitialEvents=true; it ends
// at the initial-events-end bookmark or the first event that is not ADDED) every object event
// must be above everything delivered before, and a BOOKMARK not below. A parse error counts
// too.
func (l *wireLog) violations() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	var last uint64
	var lastDesc string
	for i, w := range l.watches {
		if w.err != nil {
			out = append(out, fmt.Sprintf("watch %d: unreadable stream: %v", i, w.err))
		}
		rv := w.query.Get("resourceVersion")
		initial := rv == "" || rv == "0" || w.query.Get("sendInitialEvents") == "true"
		var initialMax uint64
		for _, e := range w.events {
			if e.typ == stream.Error || !e.rvIsInt {
				continue
			}
			if initial && !e.iee && e.typ == stream.Added {
				initialMax = max(initialMax, e.rvInt)
				continue
			}
			if initial {
				initial = false
				last = max(last, initialMax)
			}
			desc := fmt.Sprintf("%s %s rv %s (watch %d)", e.typ, e.name, e.rv, i)
			switch {
			case e.typ == stream.Bookmark && e.rvInt < last:
				out = append(out, fmt.Sprintf("BOOKMARK rv %s below %s", e.rv, lastDesc))
			case e.typ != stream.Bookmark && e.rvInt <= last:
				out = append(out, fmt.Sprintf("%s not above %s", desc, lastDesc))
			}
			if e.rvInt > last {
				last, lastDesc = e.rvInt, desc
			}
		}
	}
	return out
}

// sanLogBuffer is a goroutine-safe log sink.
type sanLogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *sanLogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *sanLogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

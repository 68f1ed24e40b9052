package e2e

// The client side and the writer of the resilience tests (resilience_test.go): real client-go
// informers that count every request they make and every event their handlers get, a writer
// that changes configmaps directly on whichever apiserver is up and records what it did, the
// fault layer served in front of a real apiserver, and the checks that compare them.

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/watchsan/watchsan/internal/faults"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/test/cluster"
)

// Timeouts every resilience test gives watchsan, short for speed. resProbeTimeout is what a
// health verdict may take beyond the stall timeout (a health interval, 1.5 ping timeouts, a
// /readyz probe).
const (
	resStallTimeout = 3 * time.Second
	resProbeTimeout = 5 * time.Second
	// resResumeSlack is what a resume may take beyond detecting the break (backoff, a new
	// connection, the apiserver's answer), generous for -race on a busy 2-core machine.
	resResumeSlack = 6 * time.Second
	// resResumeBound bounds the time from an upstream hanging to its events flowing again.
	resResumeBound = resStallTimeout + resProbeTimeout + resResumeSlack
)

// resilienceFlags are the watchsan flags of every resilience test.
var resilienceFlags = []string{
	"--watch-stall-timeout=" + resStallTimeout.String(),
	"--http2-read-idle-timeout=2s",
	"--http2-ping-timeout=2s",
	"--health-interval=500ms",
	"--tls-handshake-timeout=2s",
	"--dial-timeout=2s",
	"--retry-budget=10s",
	"--watch-resume-timeout=60s",
	"--log-level=info", // per-event debug lines cost CPU the timings need
}

// resilienceProxyArgs are resilienceFlags plus one --upstream per apiserver given, verified
// with the cluster's CA. watchsan lends no identity: the clients send the admin token.
func resilienceProxyArgs(c *cluster.Cluster, apiservers ...int) []string {
	args := append([]string{"--upstream-ca-file=" + c.CAFile}, resilienceFlags...)
	for _, i := range apiservers {
		args = append(args, "--upstream="+c.APIServers[i].URL)
	}
	return args
}

// resilienceClientConfig is a client config for watchsan p, with the cluster's admin token.
func resilienceClientConfig(c *cluster.Cluster, p *proxy) *rest.Config {
	return &rest.Config{Host: p.URL, BearerToken: c.AdminToken, QPS: 200, Burst: 400}
}

// ---- the client side ----

// clientRequests are the requests one informer sent for its configmaps, counted as they leave
// client-go (below its own retries, so a retry client-go does by itself is counted too).
type clientRequests struct {
	lists      atomic.Int64 // LIST: a relist
	watchLists atomic.Int64 // watch with sendInitialEvents=true: the first sync, or a relist
	rewatches  atomic.Int64 // any other watch: the client re-watched from its last RV
	failures   atomic.Int64 // answers other than 2xx, and transport errors

	mu  sync.Mutex
	log []clientRequest // every request above, in the order sent
	// watchTypes counts the watch responses (200) by their Content-Type.
	watchTypes map[string]int
}

// clientRequest is one request an informer sent for its configmaps.
type clientRequest struct {
	At   time.Time
	Kind string // "list", "watch-list" or "re-watch"
}

func (c *clientRequests) note(kind string) {
	c.mu.Lock()
	c.log = append(c.log, clientRequest{At: time.Now(), Kind: kind})
	c.mu.Unlock()
}

// relists returns when the client started each relist: every LIST, and every watch-list after
// the first (which was its initial sync).
func (c *clientRequests) relists() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []time.Time
	first := true
	for _, r := range c.log {
		switch {
		case r.Kind == "watch-list" && first:
			first = false
		case r.Kind == "watch-list", r.Kind == "list":
			out = append(out, r.At)
		}
	}
	return out
}

// countingRT counts the requests for one collection path.
type countingRT struct {
	next http.RoundTripper
	path string
	c    *clientRequests
}

func (rt *countingRT) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Path == rt.path && req.Method == http.MethodGet {
		q := req.URL.Query()
		switch watch, _ := strconv.ParseBool(q.Get("watch")); {
		case !watch:
			rt.c.lists.Add(1)
			rt.c.note("list")
		case q.Get("sendInitialEvents") == "true":
			rt.c.watchLists.Add(1)
			rt.c.note("watch-list")
		default:
			rt.c.rewatches.Add(1)
			rt.c.note("re-watch")
		}
	}
	resp, err := rt.next.RoundTrip(req)
	if req.URL.Path == rt.path && (err != nil || resp.StatusCode >= 300) {
		rt.c.failures.Add(1)
	}
	if req.URL.Path == rt.path && err == nil && resp.StatusCode == http.StatusOK && req.URL.Query().Get("watch") != "" {
		rt.c.mu.Lock()
		if rt.c.watchTypes == nil {
			rt.c.watchTypes = map[string]int{}
		}
		rt.c.watchTypes[resp.Header.Get("Content-Type")]++
		rt.c.mu.Unlock()
	}
	return resp, err
}

// cmChange is one event as a handler saw it, or one change as the writer made it.
type cmChange struct {
	Type string // ADDED, MODIFIED, DELETED
	Name string
	RV   string // "" for the writer's deletes (a configmap delete answers a Status)
	// Seq is the writer's sequence number in the object's data ("seq"): unique per create and
	// update; a delete carries the one of the state it deleted.
	Seq string
	At  time.Time

	// Only for what a handler saw:
	// Resync: an update whose old and new object have the same resourceVersion (what a relist
	// hands the handlers for an object that did not change), not a change.
	Resync bool
	// Tombstone: a delete a relist inferred (cache.DeletedFinalStateUnknown); its object is
	// the last state the informer knew.
	Tombstone bool
	// Initial: an add from a (re)list rather than from a watch event.
	Initial bool
}

func (o cmChange) String() string { return o.Type + " " + o.Name + "@" + o.RV }

// countingInformer is one real client-go shared informer (resync 0, watch-list as client-go
// v0.37 does by default) on the configmaps of a namespace, recording everything.
type countingInformer struct {
	name     string
	req      clientRequests
	errs     atomic.Int64 // the informer's watch error handler calls: client-visible failures
	informer cache.SharedIndexInformer

	mu     sync.Mutex
	events []cmChange
	first  map[string]time.Time // name -> when it was first added
	lastEr string
	maxRV  uint64 // the highest resourceVersion any event carried
}

// startCountingInformer runs an informer with cfg (its transport wrapped to count) and waits
// until it has synced; it stops in t.Cleanup.
func startCountingInformer(t *testing.T, name string, cfg *rest.Config, ns string) *countingInformer {
	t.Helper()
	return startCountingInformerWatching(t, name, cfg, ns, 0)
}

// startCountingInformerWatching is startCountingInformer with the timeoutSeconds of every
// watch the informer sends set to watchTimeout when it is not 0, instead of client-go's 5 to
// 10 minutes (ReflectorOptions.MinWatchTimeout can only raise it). Its watch-list too: the
// reflector goes on with the watch-list's stream once the initial events are over, so that
// stream's timeout is when its first plain re-watch comes. When a watch ends at its timeout
// the reflector re-watches from its last resourceVersion, so a short one makes re-watches
// frequent.
func startCountingInformerWatching(t *testing.T, name string, cfg *rest.Config, ns string, watchTimeout time.Duration) *countingInformer {
	t.Helper()
	return startCountingInformerOf(t, name, cfg, ns, "configmaps", watchTimeout)
}

// startCountingInformerOf is startCountingInformerWatching on resource, "configmaps" or
// "secrets" (the soak's compaction faults watch secrets, whose watch cache is off: see
// soakCompactResource). A secret's "seq" is read from its data as a configmap's is.
func startCountingInformerOf(t *testing.T, name string, cfg *rest.Config, ns, resource string, watchTimeout time.Duration) *countingInformer {
	t.Helper()
	w := &countingInformer{name: name, first: map[string]time.Time{}}
	cfg = rest.CopyConfig(cfg)
	path := "/api/v1/namespaces/" + ns + "/" + resource
	inner := cfg.WrapTransport
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if inner != nil {
			rt = inner(rt)
		}
		return &countingRT{next: rt, path: path, c: &w.req}
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var tweak func(*metav1.ListOptions)
	if watchTimeout > 0 {
		secs := int64(watchTimeout.Seconds())
		tweak = func(o *metav1.ListOptions) {
			// The reflector's watches have a timeout; its lists have none.
			if o.TimeoutSeconds != nil {
				o.TimeoutSeconds = &secs
			}
		}
	}
	switch resource {
	case "configmaps":
		w.informer = coreinformers.NewFilteredConfigMapInformer(cs, ns, 0, cache.Indexers{}, tweak)
	case "secrets":
		w.informer = coreinformers.NewFilteredSecretInformer(cs, ns, 0, cache.Indexers{}, tweak)
	default:
		t.Fatalf("counting informer of %q: want configmaps or secrets", resource)
	}
	if err := w.informer.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		w.errs.Add(1)
		w.mu.Lock()
		w.lastEr = err.Error()
		w.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	record := func(typ string, obj any, resync, initial bool) {
		d, tombstone := obj.(cache.DeletedFinalStateUnknown)
		if tombstone {
			obj = d.Obj
		}
		objName, rv, seq, ok := countedFacts(obj)
		if !ok {
			return
		}
		o := cmChange{Type: typ, Name: objName, RV: rv, Seq: seq, At: time.Now(),
			Resync: resync, Tombstone: tombstone, Initial: initial}
		w.mu.Lock()
		w.events = append(w.events, o)
		if rv, err := strconv.ParseUint(o.RV, 10, 64); err == nil && rv > w.maxRV {
			w.maxRV = rv
		}
		if _, seen := w.first[o.Name]; !seen && typ == "ADDED" {
			w.first[o.Name] = o.At
		}
		w.mu.Unlock()
	}
	rvOf := func(obj any) string {
		_, rv, _, _ := countedFacts(obj)
		return rv
	}
	if _, err := w.informer.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc:    func(obj any, initial bool) { record("ADDED", obj, false, initial) },
		UpdateFunc: func(old, obj any) { record("MODIFIED", obj, rvOf(old) == rvOf(obj), false) },
		DeleteFunc: func(obj any) { record("DELETED", obj, false, false) },
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.informer.RunWithContext(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("informer %s did not stop within 10s", name)
		}
	})
	eventually(t, 30*time.Second, "informer "+name+" to sync", w.informer.HasSynced)
	return w
}

// countedFacts is the name, resourceVersion and writer's sequence number ("seq" in its data)
// of a configmap or a secret; ok is false for anything else.
func countedFacts(obj any) (name, rv, seq string, ok bool) {
	switch o := obj.(type) {
	case *corev1.ConfigMap:
		return o.Name, o.ResourceVersion, o.Data["seq"], true
	case *corev1.Secret:
		return o.Name, o.ResourceVersion, string(o.Data["seq"]), true
	}
	return "", "", "", false
}

// seen returns when the informer first got an ADDED for name.
func (w *countingInformer) seen(name string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	at, ok := w.first[name]
	return at, ok
}

// waitSeen waits up to timeout for name's ADDED and returns when it arrived.
func (w *countingInformer) waitSeen(t *testing.T, name string, timeout time.Duration) time.Time {
	t.Helper()
	var at time.Time
	eventually(t, timeout, fmt.Sprintf("informer %s to get %s", w.name, name), func() bool {
		var ok bool
		at, ok = w.seen(name)
		return ok
	})
	return at
}

// highestRV returns the highest resourceVersion the informer's handlers got.
func (w *countingInformer) highestRV() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.maxRV
}

// relists counts the informer's relists: every LIST, every watch-list after the first.
func (w *countingInformer) relists() int64 {
	return w.req.lists.Load() + max(w.req.watchLists.Load()-1, 0)
}

func (w *countingInformer) history() []cmChange {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.events)
}

// counts summarizes what the client did, for logs and failures.
func (w *countingInformer) counts() string {
	w.mu.Lock()
	last := w.lastEr
	w.mu.Unlock()
	return fmt.Sprintf("%s: watch-lists=%d lists=%d re-watches=%d failed-requests=%d watch-errors=%d (last: %q)",
		w.name, w.req.watchLists.Load(), w.req.lists.Load(), w.req.rewatches.Load(), w.req.failures.Load(), w.errs.Load(), last)
}

// disturbances counts what shows that the client noticed a break: a relist (LIST or a second
// watch-list), a re-watch, a failed request, a watch error.
func (w *countingInformer) disturbances() int64 {
	return w.req.lists.Load() + max(w.req.watchLists.Load()-1, 0) + w.req.rewatches.Load() +
		w.req.failures.Load() + w.errs.Load()
}

// requireUndisturbed fails unless the client made exactly its first watch-list and nothing
// else: no relist, no re-watch, no failed request, no watch error.
func (w *countingInformer) requireUndisturbed(t *testing.T) {
	t.Helper()
	if w.req.watchLists.Load() != 1 || w.disturbances() != 0 {
		t.Errorf("client noticed the break: %s; want exactly one watch-list and nothing else", w.counts())
	}
}

// requireDisturbed fails unless the client noticed a break (the control of each scenario:
// without watchsan, or with resume disabled, the break must show).
func (w *countingInformer) requireDisturbed(t *testing.T) {
	t.Helper()
	if w.disturbances() == 0 {
		t.Errorf("control client noticed nothing (%s): the scenario did not break anything, so the test cannot tell watchsan's resume from no fault at all", w.counts())
	}
}

// ---- the writer ----

// recordingWriter changes configmaps in a namespace, directly on the apiservers, one change at
// a time: each of a few objects is created, updated twice, deleted, created again, and so on.
// A failed request is retried on the next apiserver it may use; an outcome left unknown by a
// failure (the change may have happened) is settled by reading the object. Every change is
// recorded with the resourceVersion the apiserver gave it.
type recordingWriter struct {
	t  *testing.T
	ns string
	cs []kubernetes.Interface
	// avoided[i] keeps new requests off apiserver i; gate[i] is held (read) by each request to
	// i, so avoid can wait until none is in flight.
	avoided []atomic.Bool
	gate    []sync.RWMutex

	mu      sync.Mutex
	ops     map[string][]cmChange
	objs    map[string]*corev1.ConfigMap
	seq     int
	changes int
	errs    []string

	stopLoop context.CancelFunc
	loopDone chan struct{}
}

func newRecordingWriter(t *testing.T, c *cluster.Cluster, ns string) *recordingWriter {
	w := &recordingWriter{t: t, ns: ns, avoided: make([]atomic.Bool, len(c.APIServers)), gate: make([]sync.RWMutex, len(c.APIServers)),
		ops: map[string][]cmChange{}, objs: map[string]*corev1.ConfigMap{}}
	for i := range c.APIServers {
		cs, err := kubernetes.NewForConfig(c.RESTConfig(i, c.AdminToken))
		if err != nil {
			t.Fatal(err)
		}
		w.cs = append(w.cs, cs)
	}
	return w
}

// avoid keeps the writer off apiserver i from now on and waits until no request to it is in
// flight (a request frozen with the apiserver could otherwise land after later changes).
func (w *recordingWriter) avoid(i int) {
	w.gate[i].Lock() // waits out the requests in flight
	w.avoided[i].Store(true)
	w.gate[i].Unlock()
}

// allow lets the writer use apiserver i again.
func (w *recordingWriter) allow(i int) { w.avoided[i].Store(false) }

// start runs the change loop, one change every pace, until stop.
func (w *recordingWriter) start(objects int, pace time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	w.stopLoop, w.loopDone = cancel, make(chan struct{})
	go func() {
		defer close(w.loopDone)
		t := time.NewTicker(pace)
		defer t.Stop()
		for step := 0; ; step++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			w.step(fmt.Sprintf("obj-%02d", step%objects))
		}
	}()
	w.t.Cleanup(w.stop)
}

// stop ends the change loop after the change in progress.
func (w *recordingWriter) stop() {
	if w.stopLoop != nil {
		w.stopLoop()
		<-w.loopDone
	}
}

// lastRV returns the resourceVersion of the writer's latest create or update (0 before one).
func (w *recordingWriter) lastRV() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var last uint64
	for _, ops := range w.ops {
		for i := len(ops) - 1; i >= 0; i-- {
			if rv, err := strconv.ParseUint(ops[i].RV, 10, 64); err == nil {
				last = max(last, rv)
				break
			}
		}
	}
	return last
}

// history returns every change the writer made, by object.
func (w *recordingWriter) history() map[string][]cmChange {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string][]cmChange, len(w.ops))
	for k, v := range w.ops {
		out[k] = slices.Clone(v)
	}
	return out
}

// errors returns the writer's failures so far.
func (w *recordingWriter) errors() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.errs)
}

// count returns how many changes the writer made.
func (w *recordingWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changes
}

func (w *recordingWriter) fail(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errs = append(w.errs, fmt.Sprintf(format, args...))
}

func (w *recordingWriter) record(o cmChange) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ops[o.Name] = append(w.ops[o.Name], o)
	w.changes++
}

// definite reports whether err is an answer about the object itself rather than a failure to
// get one.
func definiteAnswer(err error) bool {
	return apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) || apierrors.IsNotFound(err) ||
		apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err)
}

// do runs f against an apiserver the writer may use, trying the next one after a failure,
// until f gets a definite answer or 90s pass. It returns that answer and whether an earlier
// attempt failed without one (so the change may already have happened).
func (w *recordingWriter) do(f func(ctx context.Context, cs kubernetes.Interface) error) (err error, retried bool) {
	deadline := time.Now().Add(90 * time.Second)
	for attempt, next := 0, 0; ; attempt++ {
		i := -1
		for k := range w.cs {
			j := (next + k) % len(w.cs)
			w.gate[j].RLock()
			if !w.avoided[j].Load() {
				i = j
				break
			}
			w.gate[j].RUnlock()
		}
		if i >= 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			err = f(ctx, w.cs[i])
			cancel()
			w.gate[i].RUnlock()
			if err == nil || definiteAnswer(err) {
				return err, attempt > 0
			}
			next = i + 1
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no apiserver answered for 90s: %w", err), attempt > 0
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// step makes the next change to object name.
func (w *recordingWriter) step(name string) {
	w.mu.Lock()
	cur := w.objs[name]
	w.seq++
	seq := strconv.Itoa(w.seq)
	updates := 0
	if ops := w.ops[name]; len(ops) > 0 {
		for i := len(ops) - 1; i >= 0 && ops[i].Type == "MODIFIED"; i-- {
			updates++
		}
	}
	w.mu.Unlock()
	switch {
	case cur == nil:
		w.create(name, seq)
	case updates < 2:
		w.update(cur, seq)
	default:
		w.remove(cur)
	}
}

// create creates name and records it; markers use it too.
func (w *recordingWriter) create(name, seq string) *corev1.ConfigMap {
	want := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.ns}, Data: map[string]string{"seq": seq}}
	var got *corev1.ConfigMap
	err, retried := w.do(func(ctx context.Context, cs kubernetes.Interface) error {
		var err error
		got, err = cs.CoreV1().ConfigMaps(w.ns).Create(ctx, want, metav1.CreateOptions{})
		return err
	})
	if apierrors.IsAlreadyExists(err) && retried {
		got, err = w.settle(name, seq)
	}
	if err != nil {
		w.fail("create %s: %v", name, err)
		return nil
	}
	w.mu.Lock()
	w.objs[name] = got
	w.mu.Unlock()
	w.record(cmChange{Type: "ADDED", Name: name, RV: got.ResourceVersion, Seq: seq, At: time.Now()})
	return got
}

func (w *recordingWriter) update(cur *corev1.ConfigMap, seq string) {
	want := cur.DeepCopy() // carries cur's resourceVersion: a precondition
	want.Data = map[string]string{"seq": seq}
	var got *corev1.ConfigMap
	err, retried := w.do(func(ctx context.Context, cs kubernetes.Interface) error {
		var err error
		got, err = cs.CoreV1().ConfigMaps(w.ns).Update(ctx, want, metav1.UpdateOptions{})
		return err
	})
	if apierrors.IsConflict(err) && retried {
		got, err = w.settle(cur.Name, seq)
	}
	if err != nil {
		w.fail("update %s: %v", cur.Name, err)
		return
	}
	w.mu.Lock()
	w.objs[cur.Name] = got
	w.mu.Unlock()
	w.record(cmChange{Type: "MODIFIED", Name: cur.Name, RV: got.ResourceVersion, Seq: seq, At: time.Now()})
}

func (w *recordingWriter) remove(cur *corev1.ConfigMap) {
	uid := cur.UID
	err, retried := w.do(func(ctx context.Context, cs kubernetes.Interface) error {
		return cs.CoreV1().ConfigMaps(w.ns).Delete(ctx, cur.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	})
	if apierrors.IsNotFound(err) && retried {
		err = nil // an attempt that failed had deleted it
	}
	if err != nil {
		w.fail("delete %s: %v", cur.Name, err)
		return
	}
	w.mu.Lock()
	delete(w.objs, cur.Name)
	w.mu.Unlock()
	w.record(cmChange{Type: "DELETED", Name: cur.Name, Seq: cur.Data["seq"], At: time.Now()})
}

// settle reads name after a change whose first attempt failed without an answer and a retry
// was refused as already done: it must hold the data of that change.
func (w *recordingWriter) settle(name, seq string) (*corev1.ConfigMap, error) {
	var got *corev1.ConfigMap
	err, _ := w.do(func(ctx context.Context, cs kubernetes.Interface) error {
		var err error
		got, err = cs.CoreV1().ConfigMaps(w.ns).Get(ctx, name, metav1.GetOptions{})
		return err
	})
	if err != nil {
		return nil, err
	}
	if got.Data["seq"] != seq {
		return nil, fmt.Errorf("after an unanswered attempt %s holds seq %q, want %q", name, got.Data["seq"], seq)
	}
	return got, nil
}

// marker creates a fresh object outside the change loop and returns its name; the time an
// informer gets it measures how long events take to reach it.
func (w *recordingWriter) marker(name string) string { return w.markerObject(name).Name }

// markerObject is marker returning the object as created.
func (w *recordingWriter) markerObject(name string) *corev1.ConfigMap {
	cm := w.create(name, "marker")
	if cm == nil {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.t.Fatalf("could not create marker %s: %v", name, w.errs)
	}
	return cm
}

// ---- the checks ----

// finishAndCompare stops the writer, writes a last object and waits until every informer in
// check and wait has it (one watch stream is in RV order, so everything before it has arrived
// too), then compares each informer in check, its history and its store, with what was
// written and with a fresh list.
func finishAndCompare(t *testing.T, wr *recordingWriter, check []*countingInformer, wait []*countingInformer) {
	t.Helper()
	wr.stop()
	last := wr.marker("zz-last")
	for _, w := range append(slices.Clone(check), wait...) {
		w.waitSeen(t, last, 60*time.Second)
	}
	if errs := wr.errors(); len(errs) > 0 {
		t.Fatalf("the recordingWriter failed: %v", errs)
	}
	for _, w := range check {
		compareHistory(t, wr, w)
		compareStore(t, wr, w)
	}
}

// compareHistory compares, object by object, the events w's handlers got with the changes the
// writer made: the same changes in the same order with the same resourceVersions (none lost,
// none twice); and across objects the RVs strictly increase (one ordered stream).
func compareHistory(t *testing.T, wr *recordingWriter, w *countingInformer) {
	t.Helper()
	got := map[string][]cmChange{}
	var lastRV uint64
	for i, e := range w.history() {
		got[e.Name] = append(got[e.Name], e)
		rv, err := strconv.ParseUint(e.RV, 10, 64)
		if err != nil {
			t.Errorf("%s: event %d %v: resourceVersion not an integer", w.name, i, e)
			continue
		}
		if rv <= lastRV {
			t.Errorf("%s: event %d %v: resourceVersion not above the previous one (%d)", w.name, i, e, lastRV)
		}
		lastRV = rv
	}
	want := wr.history()
	names := map[string]bool{}
	for n := range got {
		names[n] = true
	}
	for n := range want {
		names[n] = true
	}
	bad := 0
	for _, n := range slices.Sorted(maps.Keys(names)) {
		g, x := got[n], want[n]
		same := len(g) == len(x)
		for i := 0; same && i < len(g); i++ {
			same = g[i].Type == x[i].Type && (x[i].RV == "" || g[i].RV == x[i].RV)
		}
		if !same {
			bad++
			if bad <= 5 {
				t.Errorf("%s: object %s: handlers got %v, the recordingWriter did %v", w.name, n, g, x)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d objects' histories differ (events lost, repeated or reordered)", w.name, bad, len(names))
	}
}

// compareStore compares w's store with a fresh list from an apiserver.
func compareStore(t *testing.T, wr *recordingWriter, w *countingInformer) {
	t.Helper()
	var list *corev1.ConfigMapList
	err, _ := wr.do(func(ctx context.Context, cs kubernetes.Interface) error {
		var err error
		list, err = cs.CoreV1().ConfigMaps(wr.ns).List(ctx, metav1.ListOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("fresh list: %v", err)
	}
	want := map[string]string{}
	for _, cm := range list.Items {
		want[cm.Name] = cm.ResourceVersion
	}
	got := map[string]string{}
	for _, o := range w.informer.GetStore().List() {
		cm := o.(*corev1.ConfigMap)
		got[cm.Name] = cm.ResourceVersion
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s: store differs from a fresh list:\n store %v\n list  %v", w.name, got, want)
	}
}

// resilienceNamespace creates a namespace for a test's objects.
func resilienceNamespace(t *testing.T, c *cluster.Cluster, name string) string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// ---- watchsan's side ----

// resumeGaps returns the gap of every "resumed upstream watch" line in p's log, and their
// reasons.
func resumeGaps(p *proxy) (gaps []time.Duration, reasons []string) {
	for _, line := range strings.Split(p.Log(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil || m["msg"] != "resumed upstream watch" {
			continue
		}
		switch g := m["gap"].(type) {
		case float64:
			gaps = append(gaps, time.Duration(g*float64(time.Second)))
		case string:
			if d, err := time.ParseDuration(g); err == nil {
				gaps = append(gaps, d)
			}
		}
		reasons = append(reasons, fmt.Sprint(m["reason"]))
	}
	return gaps, reasons
}

// resumeSummary describes watchsan's resumes for a log line: counts, reasons and gaps from its
// log, and its histogram's mean.
func resumeSummary(p *proxy) string {
	gaps, reasons := resumeGaps(p)
	byReason := map[string]int{}
	for _, r := range reasons {
		byReason[r]++
	}
	n := p.Metric("watchsan_watch_resume_duration_seconds_count", nil)
	mean := 0.0
	if n > 0 {
		mean = p.Metric("watchsan_watch_resume_duration_seconds_sum", nil) / n
	}
	return fmt.Sprintf("resumes=%v stalls=%v relists-forced=%v reasons=%v gaps(%s) histogram-mean=%.3fs",
		p.Metric("watchsan_watch_resumes_total", nil), p.Metric("watchsan_watch_stalls_total", nil),
		p.Metric("watchsan_watch_relists_forced_total", nil), byReason, gapStats(gaps), mean)
}

// gapStats summarizes break-to-resume gaps: count, min, median, max.
func gapStats(gaps []time.Duration) string {
	if len(gaps) == 0 {
		return "none"
	}
	s := slices.Clone(gaps)
	slices.Sort(s)
	return fmt.Sprintf("n=%d min=%v median=%v max=%v", len(s), s[0].Round(time.Millisecond),
		s[len(s)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}

// requireWatching fails unless watchsan p holds at least n open configmap watches: the
// informers' watches do go through it (an open watch is not in watchsan_requests_total yet).
func requireWatching(t *testing.T, p *proxy, n int) {
	t.Helper()
	if got := p.Metric("watchsan_open_watches", map[string]string{"resource": "configmaps"}); got < float64(n) {
		t.Errorf("watchsan holds %v open configmap watches, want at least %d: traffic bypassed the proxy", got, n)
	}
}

// rawWatch is a plain JSON watch, as a client that is not client-go would hold one: it reads
// every event until the stream ends, and never closes the stream itself.
type rawWatch struct {
	stop   context.CancelFunc // closes the stream from the client's side
	mu     sync.Mutex
	events []string // TYPE@RV, or ERROR:<code>
	ended  chan struct{}
	err    error // how the stream ended (io.EOF: cleanly); read after ended
}

// startRawWatch watches the configmaps of ns through url from resourceVersion rv with token.
func startRawWatch(t *testing.T, url, token, ns, rv string) *rawWatch {
	t.Helper()
	return startRawWatchURL(t, url+"/api/v1/namespaces/"+ns+"/configmaps?watch=true&resourceVersion="+rv, token)
}

// startRawWatchURL is startRawWatch for a watch URL of the caller's (its query: bookmarks, a
// selector).
func startRawWatchURL(t *testing.T, watchURL, token string) *rawWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, watchURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		t.Fatalf("raw watch: %s", resp.Status)
	}
	rw := &rawWatch{stop: cancel, ended: make(chan struct{})}
	go func() {
		defer close(rw.ended)
		defer resp.Body.Close()
		dec := json.NewDecoder(resp.Body)
		for {
			var ev struct {
				Type   string
				Object struct {
					Code     int32
					Metadata struct{ ResourceVersion string }
				}
			}
			if err := dec.Decode(&ev); err != nil {
				rw.err = err
				return
			}
			s := ev.Type + "@" + ev.Object.Metadata.ResourceVersion
			if ev.Type == "ERROR" {
				s = "ERROR:" + strconv.Itoa(int(ev.Object.Code))
			}
			rw.mu.Lock()
			rw.events = append(rw.events, s)
			rw.mu.Unlock()
		}
	}()
	return rw
}

// errorEvents returns the ERROR events the watch got so far.
func (rw *rawWatch) errorEvents() []string {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	var out []string
	for _, e := range rw.events {
		if strings.HasPrefix(e, "ERROR") {
			out = append(out, e)
		}
	}
	return out
}

// ---- the fault layer in front of a real apiserver ----

// faultedAPIServer serves a faults.Layer over TLS with HTTP/2 (so GOAWAY and resets are the real
// frames) in front of a ReverseProxy to a real apiserver.
type faultedAPIServer struct {
	layer  *faults.Layer
	URL    string
	CAFile string
	// hangReadyz makes /readyz hang until the caller gives up, as on a hung apiserver.
	hangReadyz atomic.Bool
	conns      atomic.Int64 // TLS connections accepted
	watching   atomic.Int64 // watch requests being served now
	srv        *httptest.Server
}

// cutConnections closes every client connection the layer's server holds, now: every watch
// through it breaks mid-stream (the client reads an unexpected EOF), quiet ones too, which the
// layer's own resets, after an event, never reach.
func (f *faultedAPIServer) cutConnections() { f.srv.CloseClientConnections() }

func newFaultedAPIServer(t *testing.T, c *cluster.Cluster, i int) *faultedAPIServer {
	t.Helper()
	target, _ := url.Parse(c.APIServers[i].URL)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(c.CAData)
	rp := &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(target); pr.Out.Host = target.Host },
		Transport: faultLayerTransport(t, roots),
		ErrorLog:  log.New(io.Discard, "", 0),
	}
	f := &faultedAPIServer{layer: faults.New(rp, nil)}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" && f.hangReadyz.Load() {
			<-r.Context().Done()
			return
		}
		if reqinfo.Parse(r).IsWatch() {
			f.watching.Add(1)
			defer f.watching.Add(-1)
		}
		f.layer.ServeHTTP(w, r)
	})
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = true
	srv.Config.ConnContext = faults.ConnContext
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			f.conns.Add(1)
		}
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	f.srv = srv
	f.URL = srv.URL
	f.CAFile = filepath.Join(t.TempDir(), "front-ca.pem")
	if err := os.WriteFile(f.CAFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// set activates faults on the layer.
func (f *faultedAPIServer) set(t *testing.T, fs faults.Faults) {
	t.Helper()
	if err := f.layer.Set(fs); err != nil {
		t.Fatal(err)
	}
}

// directThrough is a client config that talks to the layer directly (no watchsan).
func (f *faultedAPIServer) directConfig(c *cluster.Cluster) *rest.Config {
	return &rest.Config{Host: f.URL, BearerToken: c.AdminToken, QPS: 200, Burst: 400,
		TLSClientConfig: rest.TLSClientConfig{CAFile: f.CAFile}}
}

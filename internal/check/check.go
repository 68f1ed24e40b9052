// Package check is `watchsan check`: it tells whether the path to a cluster (the apiserver
// itself, or a gateway or proxy in front of it) has the problems watchsan exists for. In a
// temporary namespace it runs the reproduction of kubernetes#58545 (create a, create others,
// delete a, while watching) and looks at the resourceVersions exactly as they were on the
// wire; it re-watches from the DELETED event's resourceVersion to see whether events are
// replayed; it keeps a quiet watch that asked for bookmarks and an idle one open for bounded
// times, to see whether bookmarks arrive and whether the path cuts idle watches; and it
// compares the apiserver's version with the affected releases (docs/design.md sections 1a,
// 1b and 2).
//
// Exit codes of `watchsan check` (Main): 0 no problem found, 1 a problem found (affected),
// 2 bad flags or kubeconfig, or the check could not run to its end (the server refused,
// the run timed out, it was interrupted); the namespace is deleted in every case.
package check

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/watchsan/watchsan/internal/stream"
)

// ManagedByLabel is set, with value ManagedByValue, on every namespace the check creates, so
// that leftovers (from a check that was killed) can be found and deleted:
// kubectl delete namespace -l app.kubernetes.io/managed-by=watchsan-check
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "watchsan-check"
	// runLabel tells one run's namespace from another's, so that a run whose namespace
	// create failed midway (interrupted) finds the namespace if it was made after all.
	runLabel = "watchsan.io/check-run"
)

const (
	defaultPrefix         = "watchsan-check-"
	defaultObjects        = 3
	defaultStepTimeout    = 30 * time.Second
	defaultCleanupTimeout = 30 * time.Second
	// MinBookmarkWait is the shortest bookmark wait that means something: an apiserver sends
	// its pre-deadline bookmark 2 s before the deadline.
	MinBookmarkWait = 5 * time.Second
	// preDeadlineSlack is how close to the deadline a bookmark counts as the pre-deadline one.
	preDeadlineSlack = 2500 * time.Millisecond
	maxFrame         = 16 << 20
	markerName       = "marker"
	// tickLabel marks the object written to make the watch cache advance (see waitQuiet);
	// quietSelector leaves it out of the quiet watches.
	tickLabel     = "watchsan.io/check-tick"
	quietSelector = "!" + tickLabel
)

// The two resources the check writes, through client-go's dynamic client (see New).
var (
	namespacesResource = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	configMapsResource = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
)

// Options are one check's settings.
type Options struct {
	// NamespacePrefix is the temporary namespace's generateName (the server appends 5 random
	// characters). Zero: "watchsan-check-".
	NamespacePrefix string
	// Objects is how many objects are created between a and its delete. Zero: 3.
	Objects int
	// BookmarkWait is how long a quiet watch that asked for bookmarks is kept open (it is asked
	// with this timeoutSeconds, rounded up to seconds). Zero: the bookmark check is skipped;
	// otherwise at least MinBookmarkWait.
	BookmarkWait time.Duration
	// IdleWait is how long an idle watch is kept open to see whether the path cuts it. Zero:
	// the idle check is skipped. It runs at the same time as the bookmark check.
	IdleWait time.Duration
	// StepTimeout bounds each step that waits for the server: a request, an event expected on
	// a watch. Zero: 30 s.
	StepTimeout time.Duration
	// CleanupTimeout bounds deleting the namespace, which runs with a context of its own when
	// the run's was cancelled. Zero: 30 s.
	CleanupTimeout time.Duration
}

// Validate reports every problem with o at once.
func (o Options) Validate() error {
	var errs []error
	if o.Objects < 0 || o.Objects > 100 {
		errs = append(errs, fmt.Errorf("objects %d: want 1 to 100 (0: %d)", o.Objects, defaultObjects))
	}
	if o.BookmarkWait < 0 || (o.BookmarkWait > 0 && o.BookmarkWait < MinBookmarkWait) {
		errs = append(errs, fmt.Errorf("bookmark wait %v: want 0 (skip) or at least %v", o.BookmarkWait, MinBookmarkWait))
	}
	if o.IdleWait < 0 {
		errs = append(errs, fmt.Errorf("idle wait %v: want 0 (skip) or positive", o.IdleWait))
	}
	if o.StepTimeout < 0 || o.CleanupTimeout < 0 {
		errs = append(errs, errors.New("step and cleanup timeouts: want 0 (default) or positive"))
	}
	return errors.Join(errs...)
}

func (o Options) withDefaults() Options {
	if o.NamespacePrefix == "" {
		o.NamespacePrefix = defaultPrefix
	}
	if o.Objects == 0 {
		o.Objects = defaultObjects
	}
	if o.StepTimeout == 0 {
		o.StepTimeout = defaultStepTimeout
	}
	if o.CleanupTimeout == 0 {
		o.CleanupTimeout = defaultCleanupTimeout
	}
	return o
}

// Checker runs checks against one cluster path.
type Checker struct {
	client   dynamic.Interface // namespaces and configmaps, as unstructured objects
	raw      rest.Interface    // GET /version and the watches read off the wire
	server   string
	clock    clock.WithTickerAndDelayedExecution
	progress *Progress
	log      *zap.Logger
}

// NewClient returns the REST client New wants, for the cluster rc names: an unversioned
// client with client-go's dynamic (unstructured JSON) serializer. Neither it nor the dynamic
// client links a k8s.io/api package; a typed client, even core/v1 alone, links client-go's
// scheme and with it every API group (about 20 MB of watchsan's binary; a test in
// internal/cli checks).
func NewClient(rc *rest.Config) (rest.Interface, error) {
	c, err := rest.UnversionedRESTClientFor(dynamic.ConfigFor(rc))
	if err != nil {
		return nil, err // Main prefixes it, as it did the typed client's
	}
	return c, nil
}

// New returns a Checker that talks to the cluster through client (from NewClient): the
// namespace and configmaps through a dynamic client on top of it, /version and the watches
// raw. server is the URL the client talks to (for the report), clk the time source for every
// measurement, progress where the progress line goes (nil: nowhere), log the logger (nil:
// none).
func New(client rest.Interface, server string, clk clock.WithTickerAndDelayedExecution, progress *Progress, log *zap.Logger) *Checker {
	if log == nil {
		log = zap.NewNop()
	}
	return &Checker{client: dynamic.New(client), raw: client, server: server, clock: clk,
		progress: progress, log: log.Named("check")}
}

// Run runs one check and returns its report. An error means the check could not run to its
// end (the report then holds what was found so far). The namespace it creates is deleted
// before Run returns, also when ctx is cancelled: that cleanup gets a context of its own,
// bounded by CleanupTimeout.
func (c *Checker) Run(ctx context.Context, o Options) (rep Report, err error) {
	if err := o.Validate(); err != nil {
		return Report{}, err
	}
	o = o.withDefaults()
	rep = Report{Server: c.server, Problems: []string{}}
	defer c.progress.Done()

	c.progress.Step("asking the apiserver's version")
	if err := c.checkVersion(ctx, o, &rep); err != nil {
		return rep, err
	}

	c.progress.Step("creating a temporary namespace")
	ns, err := c.createNamespace(ctx, o)
	if ns != "" {
		rep.Namespace = ns
		defer func() { rep.Cleanup = c.cleanup(ns, o) }()
	}
	if err != nil {
		return rep, err
	}

	markerRV, err := c.reproduce(ctx, o, ns, &rep)
	if err != nil {
		return rep, err
	}
	if err := c.waitQuiet(ctx, o, ns, markerRV, &rep); err != nil {
		return rep, err
	}
	rep.Problems = problems(&rep)
	rep.Affected = len(rep.Problems) > 0
	return rep, nil
}

func (c *Checker) checkVersion(ctx context.Context, o Options, rep *Report) error {
	ctx, cancel := context.WithTimeout(ctx, o.StepTimeout)
	defer cancel()
	body, err := c.raw.Get().AbsPath("/version").Do(ctx).Raw()
	if err != nil {
		return fmt.Errorf("GET /version: %w", err)
	}
	var v struct {
		GitVersion string `json:"gitVersion"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("GET /version: %w", err)
	}
	affected, known, detail := VersionAffected(v.GitVersion)
	rep.Version = VersionResult{GitVersion: v.GitVersion, Known: known, Affected: affected, Detail: detail}
	return nil
}

// createNamespace creates the temporary namespace. When the request fails, the namespace may
// have been created all the same (the request reached the server, the answer was lost when
// the run was interrupted): it is looked up by this run's label and its name returned with
// the error, so that it is deleted too.
func (c *Checker) createNamespace(ctx context.Context, o Options) (string, error) {
	run := rand.String(10)
	cctx, cancel := context.WithTimeout(ctx, o.StepTimeout)
	defer cancel()
	nsObj := &unstructured.Unstructured{}
	nsObj.SetAPIVersion("v1")
	nsObj.SetKind("Namespace")
	nsObj.SetGenerateName(o.NamespacePrefix)
	nsObj.SetLabels(map[string]string{ManagedByLabel: ManagedByValue, runLabel: run})
	nsObj, err := c.client.Resource(namespacesResource).Create(cctx, nsObj, metav1.CreateOptions{})
	if err != nil {
		err = fmt.Errorf("creating the temporary namespace: %w", err)
		lctx, cancel := context.WithTimeout(context.Background(), o.CleanupTimeout)
		defer cancel()
		l, lerr := c.client.Resource(namespacesResource).List(lctx, metav1.ListOptions{LabelSelector: runLabel + "=" + run})
		if lerr == nil && len(l.Items) == 1 {
			return l.Items[0].GetName(), err
		}
		return "", err
	}
	c.log.Info("namespace created", zap.String("namespace", nsObj.GetName()))
	return nsObj.GetName(), nil
}

// cleanup deletes the namespace with a context of its own.
func (c *Checker) cleanup(ns string, o Options) CleanupResult {
	c.progress.Step("deleting namespace %s", ns)
	ctx, cancel := context.WithTimeout(context.Background(), o.CleanupTimeout)
	defer cancel()
	err := c.client.Resource(namespacesResource).Delete(ctx, ns, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		c.log.Warn("could not delete the namespace", zap.String("namespace", ns), zap.Error(err))
		return CleanupResult{Error: err.Error()}
	}
	return CleanupResult{Deleted: true}
}

// createObject creates configmap ns/name and returns its resourceVersion.
func (c *Checker) createObject(ctx context.Context, o Options, ns, name string, labels map[string]string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, o.StepTimeout)
	defer cancel()
	cm := &unstructured.Unstructured{Object: map[string]any{
		"data": map[string]any{"created-by": "watchsan check"},
	}}
	cm.SetAPIVersion("v1")
	cm.SetKind("ConfigMap")
	cm.SetName(name)
	if labels != nil {
		cm.SetLabels(labels)
	}
	cm, err := c.client.Resource(configMapsResource).Namespace(ns).Create(ctx, cm, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("creating configmap %s/%s: %w", ns, name, err)
	}
	return cm.GetResourceVersion(), nil
}

// reproduce runs the reproduction of kubernetes#58545 and the re-watch from the DELETED
// event's resourceVersion; it returns the resourceVersion of the marker object created last.
func (c *Checker) reproduce(ctx context.Context, o Options, ns string, rep *Report) (string, error) {
	c.progress.Step("watching configmaps in %s", ns)
	// The namespace has no configmap yet; a watch from "0" would start with synthetic ADDED
	// events in no order, so watch from now: the namespace's list RV.
	start, err := c.listRV(ctx, o, ns)
	if err != nil {
		return "", err
	}
	w, err := c.openWatch(ctx, o, ns, start, "", false, 0)
	if err != nil {
		return "", err
	}
	defer w.close()

	c.progress.Step("creating a and %d others, deleting a", o.Objects)
	names := []string{"a"}
	for i := 1; i <= o.Objects; i++ {
		names = append(names, "other-"+strconv.Itoa(i))
	}
	for _, n := range names {
		if _, err := c.createObject(ctx, o, ns, n, nil); err != nil {
			return "", err
		}
	}
	dctx, cancel := context.WithTimeout(ctx, o.StepTimeout)
	err = c.client.Resource(configMapsResource).Namespace(ns).Delete(dctx, "a", metav1.DeleteOptions{})
	cancel()
	if err != nil {
		return "", fmt.Errorf("deleting configmap %s/a: %w", ns, err)
	}

	c.progress.Step("waiting for the DELETED event of a")
	d := &rep.Delete
	d.OutOfOrder, d.Replayed = []Event{}, []Event{}
	var highest uint64
	var prev *wireEvent
	deadline := c.clock.NewTimer(o.StepTimeout)
	defer deadline.Stop()
	for {
		ev, err := w.next(ctx, deadline.C())
		if err != nil {
			return "", fmt.Errorf("watching for the DELETED event of a (after %d events): %w", len(d.Events), err)
		}
		if ev.Type == stream.Bookmark {
			continue
		}
		if ev.Type == stream.Error {
			return "", fmt.Errorf("the watch sent an ERROR event: %s", errorEventText(ev))
		}
		e := Event{Type: ev.Type, Name: ev.Name, RV: ev.RV}
		d.Events = append(d.Events, e)
		if ev.RVIsInt {
			if ev.RVInt <= highest {
				d.OutOfOrder = append(d.OutOfOrder, e)
			}
			highest = max(highest, ev.RVInt)
		}
		if ev.Type == stream.Deleted && ev.Name == "a" {
			d.DeletedRV = ev.RV
			if prev != nil {
				d.PreviousRV = prev.RV
				d.WentBackwards = ev.RVIsInt && prev.RVIsInt && ev.RVInt <= prev.RVInt
			}
			break
		}
		prev = &ev
	}
	w.close()

	return c.rewatch(ctx, o, ns, highest, rep)
}

// rewatch watches again from the DELETED event's resourceVersion, as a client's next re-watch
// would, creates a marker object and collects every event before the marker's that the first
// watch had delivered already (resourceVersion not above the highest it delivered).
func (c *Checker) rewatch(ctx context.Context, o Options, ns string, highest uint64, rep *Report) (string, error) {
	d := &rep.Delete
	c.progress.Step("watching again from the DELETED event's resourceVersion %s", d.DeletedRV)
	w, err := c.openWatch(ctx, o, ns, d.DeletedRV, "", false, 0)
	if err != nil {
		var st apierrors.APIStatus
		if errors.As(err, &st) && st.Status().Code == 410 {
			d.RewatchError = "410 Gone: a client would relist everything"
			return c.createObject(ctx, o, ns, markerName, nil)
		}
		return "", err
	}
	defer w.close()
	markerRV, err := c.createObject(ctx, o, ns, markerName, nil)
	if err != nil {
		return "", err
	}
	deadline := c.clock.NewTimer(o.StepTimeout)
	defer deadline.Stop()
	for {
		ev, err := w.next(ctx, deadline.C())
		if err != nil {
			return "", fmt.Errorf("watching from %s for the marker object: %w", d.DeletedRV, err)
		}
		switch {
		case ev.Type == stream.Bookmark:
			continue
		case ev.Type == stream.Error:
			d.RewatchError = "ERROR event: " + errorEventText(ev)
			return markerRV, nil
		case ev.Name == markerName:
			return markerRV, nil
		case ev.RVIsInt && ev.RVInt <= highest:
			d.Replayed = append(d.Replayed, Event{Type: ev.Type, Name: ev.Name, RV: ev.RV})
		}
	}
}

// listRV lists the namespace's configmaps and returns the list's resourceVersion.
func (c *Checker) listRV(ctx context.Context, o Options, ns string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, o.StepTimeout)
	defer cancel()
	l, err := c.client.Resource(configMapsResource).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("listing configmaps in %s: %w", ns, err)
	}
	return l.GetResourceVersion(), nil
}

// waitQuiet keeps a watch with bookmarks and an idle one open at the same time, up to their
// waits, in the quiet namespace. Both start from markerRV, the latest write, and select only
// objects without tickLabel, so they get no event at all. Right after they start the check
// writes one object with tickLabel: an apiserver sends a watcher only bookmarks above the
// highest resourceVersion it already sent it, and a bookmark carries the last change of the
// resource the watch cache processed, so without a later change somewhere in the cluster a
// caught-up watch gets no bookmark at all (k8s.io/apiserver cacher, seen on 1.37). The tick
// gives the cache that change without waking either watch.
func (c *Checker) waitQuiet(ctx context.Context, o Options, ns, markerRV string, rep *Report) error {
	bound := max(o.BookmarkWait, o.IdleWait)
	if bound == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var bw, iw *wireWatch
	var err error
	if o.BookmarkWait > 0 {
		timeout := time.Duration(math.Ceil(o.BookmarkWait.Seconds())) * time.Second
		if bw, err = c.openWatch(ctx, o, ns, markerRV, quietSelector, true, timeout); err != nil {
			return err
		}
		defer bw.close()
	}
	if o.IdleWait > 0 {
		if iw, err = c.openWatch(ctx, o, ns, markerRV, quietSelector, false, 0); err != nil {
			return err
		}
		defer iw.close()
	}
	if _, err := c.createObject(ctx, o, ns, "tick", map[string]string{tickLabel: "true"}); err != nil {
		return err
	}

	var wg sync.WaitGroup
	var errs [2]error
	if bw != nil {
		wg.Go(func() { rep.Bookmarks, errs[0] = c.watchBookmarks(ctx, o, bw) })
	}
	if iw != nil {
		wg.Go(func() { rep.IdleCut, errs[1] = c.watchIdle(ctx, o, iw) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := c.clock.NewTicker(time.Second)
	defer tick.Stop()
	start := c.clock.Now()
	what := "waiting for bookmarks and an idle cut"
	c.progress.Waiting(start, what, 0, bound)
	for {
		select {
		case <-done:
			return errors.Join(errs[:]...)
		case now := <-tick.C():
			c.progress.Waiting(now, what, now.Sub(start), bound)
		}
	}
}

// watchBookmarks reads w, a watch with allowWatchBookmarks=true and timeoutSeconds of the
// wait, and records when bookmarks arrive.
func (c *Checker) watchBookmarks(ctx context.Context, o Options, w *wireWatch) (BookmarkResult, error) {
	res := BookmarkResult{Checked: true, WaitSeconds: seconds(o.BookmarkWait), AtSeconds: []float64{}}
	timeout := time.Duration(math.Ceil(o.BookmarkWait.Seconds())) * time.Second
	// The watch ends at its deadline; wait a little past it for that end.
	deadline := c.clock.NewTimer(timeout + 5*time.Second)
	defer deadline.Stop()
	for {
		ev, err := w.next(ctx, deadline.C())
		elapsed := c.clock.Since(w.started)
		switch {
		case errors.Is(err, errWaitOver):
			return res, nil // still open past its deadline; the bookmarks are what counts here
		case err != nil && ctx.Err() != nil:
			return res, ctx.Err()
		case err != nil:
			if elapsed < timeout-time.Second {
				res.EndedEarlySeconds = seconds(elapsed)
			}
			return res, nil
		case ev.Type == stream.Bookmark:
			res.AtSeconds = append(res.AtSeconds, seconds(elapsed))
		default:
			c.log.Info("event on the bookmark watch", zap.String("type", ev.Type), zap.String("name", ev.Name))
		}
	}
}

// watchIdle reads w, a watch without bookmarks in the quiet namespace, for the idle wait and
// reports whether and when the path ended it.
func (c *Checker) watchIdle(ctx context.Context, o Options, w *wireWatch) (IdleResult, error) {
	res := IdleResult{Checked: true, WaitSeconds: seconds(o.IdleWait)}
	deadline := c.clock.NewTimer(o.IdleWait)
	defer deadline.Stop()
	for {
		ev, err := w.next(ctx, deadline.C())
		elapsed := c.clock.Since(w.started)
		switch {
		case errors.Is(err, errWaitOver):
			return res, nil
		case err != nil && ctx.Err() != nil:
			return res, ctx.Err()
		case errors.Is(err, io.EOF):
			res.Cut, res.CutAfterSeconds, res.How = true, seconds(elapsed), "the stream ended cleanly"
			return res, nil
		case err != nil:
			res.Cut, res.CutAfterSeconds, res.How = true, seconds(elapsed), "read error: "+err.Error()
			return res, nil
		case ev.Type == stream.Error:
			res.Cut, res.CutAfterSeconds, res.How = true, seconds(elapsed), "ERROR event: "+errorEventText(ev)
			return res, nil
		default:
			// Something changed in the namespace (nobody else should write there): the watch
			// is not idle any more, but a cut is still a cut. Go on.
			c.log.Info("event on the idle watch", zap.String("type", ev.Type), zap.String("name", ev.Name))
		}
	}
}

// problems lists the problems a report shows, in plain words.
func problems(r *Report) []string {
	p := []string{}
	if r.Version.Affected {
		p = append(p, fmt.Sprintf("the apiserver's version %s is %s: its DELETED watch events carry an old resourceVersion",
			r.Version.GitVersion, r.Version.Detail))
	}
	d := r.Delete
	if d.WentBackwards {
		p = append(p, fmt.Sprintf("the DELETED event went back in resourceVersion: %s after %s (the 1.7-1.9 bug, kubernetes#58545, or a hop that replays)",
			d.DeletedRV, d.PreviousRV))
	}
	for _, e := range d.OutOfOrder {
		if e.Type == stream.Deleted && e.Name == "a" && d.WentBackwards {
			continue // said above
		}
		p = append(p, fmt.Sprintf("event %s did not come after the events before it in resourceVersion", e))
	}
	if len(d.Replayed) > 0 {
		p = append(p, fmt.Sprintf("a re-watch from the DELETED event's resourceVersion %s delivered %d events again (%s): clients see objects deleted and created again",
			d.DeletedRV, len(d.Replayed), joinEvents(d.Replayed)))
	}
	if d.RewatchError != "" {
		p = append(p, fmt.Sprintf("a re-watch from the DELETED event's resourceVersion %s failed: %s", d.DeletedRV, d.RewatchError))
	}
	if b := r.Bookmarks; b.Checked && len(b.AtSeconds) == 0 && b.EndedEarlySeconds == 0 {
		p = append(p, fmt.Sprintf("no bookmark within %gs on a watch that asked for them: the path drops bookmarks (quiet watches look dead to clients and proxies, watch-list informers never sync)",
			b.WaitSeconds))
	}
	if c := r.IdleCut; c.Cut {
		p = append(p, fmt.Sprintf("the path ended an idle watch after %gs (%s): quiet watches are cut and clients watch again",
			c.CutAfterSeconds, c.How))
	}
	return p
}

package e2e

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/watchsan/watchsan/test/cluster"
)

const (
	// quietWatches is how many quiet watches the test opens, each in a namespace of
	// its own where nothing changes.
	quietWatches = 30
	// quietAfter is how long after the killed apiserver's return the watches are counted.
	quietAfter = 20 * time.Second
	// quietOnReturned is the least of them the returned apiserver must hold by then: a fifth,
	// an even share (10) less what rebalancing may not have moved yet.
	quietOnReturned = 6
)

// TestHAQuietWatchesMove is the HA scenario's quiet-watch case, small: three apiservers behind watchsan
// (default settings), one killed; 30 watches opened through watchsan from an explicit
// resourceVersion (as informers watch, with bookmarks allowed) on namespaces where nothing
// changes, so they all sit on the two others; the killed apiserver restarted. A restarted
// apiserver's watch cache begins after the resume point of a watch that has been quiet (the
// apiservers' own lease updates move the resourceVersion on), so a watch moved onto it as it
// is gets "too old resource version" there. Done when, 20 s after the return, all 30
// clients are still watching and the returned apiserver holds at least 6 of them. On main
// before the fixes (29a0a14), 28 of the 30 streams ended with that 410 (watchsan passes it on:
// the client relists), 2 still watching, 0 on the returned apiserver, as in the issue. With
// make-before-break moves and fresh resume points (docs/design.md section 10) all 30 watch on
// and 10 are on the returned apiserver; asserted always, the numbers logged.
func TestHAQuietWatchesMove(t *testing.T) {
	c := newCluster(t, cluster.Options{APIServers: 3})
	// watchsan's defaults (as TestHAFrontend): detection, balancing and rebalancing as shipped.
	p := startProxy(t, "--upstream="+c.APIServers[0].URL, "--upstream="+c.APIServers[1].URL,
		"--upstream="+c.APIServers[2].URL, "--upstream-ca-file="+c.CAFile, "--log-level=info")
	for _, a := range c.APIServers {
		waitUpstreamUp(t, p, a.URL)
	}
	cs, err := kubernetes.NewForConfig(c.RESTConfig(1, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 2*time.Minute)
	var rv string
	for i := range quietWatches {
		ns := quietNamespace(i)
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		l, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rv = l.ResourceVersion // the newest: every watch starts from the last one's
	}

	killed := c.APIServers[0]
	if err := killed.Kill(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "watchsan to see apiserver-0 down", func() bool {
		return p.Metric("watchsan_upstream_up", map[string]string{"upstream": killed.URL}) == 0
	})
	watches := make([]*rawWatch, quietWatches)
	for i := range watches {
		q := url.Values{"watch": {"true"}, "allowWatchBookmarks": {"true"}, "resourceVersion": {rv}}
		watches[i] = startRawWatchURL(t, p.URL+"/api/v1/namespaces/"+quietNamespace(i)+"/configmaps?"+q.Encode(), c.AdminToken)
	}
	onKilled := func() int {
		return int(p.Metric("watchsan_upstream_open_watches", map[string]string{"upstream": killed.URL}))
	}
	// Also the proof that they go through watchsan.
	eventually(t, 30*time.Second, fmt.Sprintf("%d watches open through watchsan", quietWatches), func() bool {
		return p.Metric("watchsan_open_watches", map[string]string{"resource": "configmaps"}) == quietWatches
	})
	if n := onKilled(); n != 0 {
		t.Fatalf("%d watches on the killed apiserver", n)
	}

	// The cluster goes on meanwhile, as a real one does (leases), away from the quiet
	// namespaces: the restarted apiserver's watch cache begins after the watches' resume point.
	for i := range 5 {
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("elsewhere-%d", i)}}
		if _, err := cs.CoordinationV1().Leases("default").Create(ctx, lease, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := killed.Restart(ctxT(t, 2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	waitUpstreamUp(t, p, killed.URL)
	time.Sleep(time.Until(back.Add(quietAfter))) // the measuring window of the issue
	q := countQuietWatches(watches)
	q.onReturned = onKilled()
	t.Logf("quiet watches: %v %v after apiserver-0 returned; watchsan: %v forced relists, moves %v rebalance (%v not made: no target accepted), %v fresh resume points, %v resumes (%s)",
		q, quietAfter, p.Metric("watchsan_watch_relists_forced_total", nil),
		p.Metric("watchsan_upstream_watch_moves_total", map[string]string{"reason": "rebalance"}),
		p.Metric("watchsan_watch_moves_failed_total", map[string]string{"reason": "rebalance"}),
		p.Metric("watchsan_watch_fresh_resume_points_total", nil),
		p.Metric("watchsan_watch_resumes_total", nil), resumeSummary(p))
	// Asserted always (make-before-break moves, servable
	// floors, fresh resume points; docs/design.md section 10); the scenario's own "Done when"
	// conditions with WATCHSAN_ISSUE20_ASSERT=1 (the Makefile's default).
	if q.watching != quietWatches {
		t.Errorf("%d of %d quiet watches still watching %v after the killed apiserver returned, want all (%v)",
			q.watching, quietWatches, quietAfter, q)
	}
	if q.onReturned < quietOnReturned {
		t.Errorf("the returned apiserver holds %d of the quiet watches %v after its return, want at least %d",
			q.onReturned, quietAfter, quietOnReturned)
	}
}

func quietNamespace(i int) string { return fmt.Sprintf("quiet-%02d", i) }

// quietWatchCounts are what TestHAQuietWatchesMove measured.
type quietWatchCounts struct {
	watching, ended, onReturned int
	errors                      []string
}

// countQuietWatches counts the raw watches that are still open and had no ERROR event.
func countQuietWatches(watches []*rawWatch) quietWatchCounts {
	var q quietWatchCounts
	for _, w := range watches {
		errs := w.errorEvents()
		q.errors = append(q.errors, errs...)
		select {
		case <-w.ended:
			q.ended++
		default:
			if len(errs) == 0 {
				q.watching++
			}
		}
	}
	return q
}

func (q quietWatchCounts) String() string {
	byCode := map[string]int{}
	for _, e := range q.errors {
		byCode[e]++
	}
	var errs []string
	for e, n := range byCode {
		errs = append(errs, fmt.Sprintf("%d×%s", n, e))
	}
	slices.Sort(errs)
	return fmt.Sprintf("%d of %d clients still watching, %d streams ended (ERROR events: %s), %d watches on the returned apiserver",
		q.watching, quietWatches, q.ended, strings.Join(errs, " "), q.onReturned)
}

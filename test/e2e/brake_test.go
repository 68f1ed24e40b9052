package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/watchsan/watchsan/internal/faults"
	"github.com/watchsan/watchsan/test/cluster"
)

// TestBudgetWatchUpstreamEndsAfterEachEvent: one client watch whose upstream ends every
// stream right after one new event (the fault layer's end-after-delete, in front of a real
// kube-apiserver, with a backlog of deletes to deliver: each resume gets exactly one) costs a
// bounded number of upstream requests, though each resume delivers: the resume brake
// (docs/design.md section 5). Without it every resume went at once, as fast as the loop ran.
// The client still gets every event exactly once, in order, and no ERROR; its stream stays
// open.
func TestBudgetWatchUpstreamEndsAfterEachEvent(t *testing.T) {
	const (
		window = 15 * time.Second
		// The brake: 3 at once, then 250ms, 500ms, 1s, 2s, 4s (7.75 s), then one per 5 s
		// (+-25%): about 10 in 15 s. Unbraked it was hundreds.
		maxRequests = 16
		objects     = 400 // deletes in the backlog: more than the loop reaches braked
	)
	c := newCluster(t, cluster.Options{})
	front := newFaultedAPIServer(t, c, 0)
	p := budgetProxy(t, front.URL, "--upstream-ca-file="+front.CAFile)
	eventually(t, 20*time.Second, "watchsan ready", func() bool { return readyz(p) == 200 })
	cs, err := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 5*time.Minute)
	const ns = "brake"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var rv0 string
	for i := 0; i < objects; i++ {
		cm, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("cm-", i)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rv0 = cm.ResourceVersion
	}
	// The backlog: every delete after rv0, straight to the apiserver (not through the layer).
	for i := 0; i < objects; i++ {
		if err := cs.CoreV1().ConfigMaps(ns).Delete(ctx, fmt.Sprint("cm-", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	front.set(t, faults.Faults{EndWatchAfterDelete: true})

	w0 := front.layer.Stats().Watches
	wctx, cancel := context.WithTimeout(context.Background(), window)
	defer cancel()
	req, _ := http.NewRequestWithContext(wctx, http.MethodGet, p.URL+"/api/v1/namespaces/"+ns+"/configmaps?watch=true&resourceVersion="+rv0, nil)
	req.Header.Set("Authorization", "Bearer "+c.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("watch: %s", resp.Status)
	}
	type seen struct{ typ, name, rv string }
	var (
		mu           sync.Mutex
		got          []seen
		first, lastT time.Time // when the client read its first and last event
		endErr       error
		ended        = make(chan struct{})
	)
	go func() {
		defer close(ended)
		defer resp.Body.Close()
		dec := json.NewDecoder(resp.Body)
		for {
			var ev struct {
				Type   string
				Object struct {
					Metadata struct{ Name, ResourceVersion string }
				}
			}
			if err := dec.Decode(&ev); err != nil {
				mu.Lock()
				endErr = err
				mu.Unlock()
				return
			}
			mu.Lock()
			got = append(got, seen{ev.Type, ev.Object.Metadata.Name, ev.Object.Metadata.ResourceVersion})
			if first.IsZero() {
				first = time.Now()
			}
			lastT = time.Now()
			mu.Unlock()
		}
	}()
	<-wctx.Done() // the window is what is measured
	n := front.layer.Stats().Watches - w0
	<-ended
	mu.Lock()
	defer mu.Unlock()
	loop := lastT.Sub(first)
	t.Logf("budget: one client watch, upstream (kube-apiserver behind the fault layer) ends every stream after one new event: %d upstream watch requests in %v (%.1f/s); client got %d events in %v (%.1f/s while it got them), stream end %v",
		n, window, float64(n)/window.Seconds(), len(got), loop.Round(time.Millisecond), float64(len(got))/max(loop.Seconds(), 0.001), endErr)
	if n > maxRequests {
		t.Errorf("one client watch cost %d upstream watch requests in %v, want at most %d", n, window, maxRequests)
	}
	if errors.Is(endErr, io.EOF) || errors.Is(endErr, io.ErrUnexpectedEOF) {
		t.Errorf("client's stream ended (%v) before its window: it must stay open", endErr)
	}
	// Every event exactly once, in order: DELETEs of cm-0, cm-1, ... with rising RVs.
	last := uint64(0)
	for i, s := range got {
		r, _ := strconv.ParseUint(s.rv, 10, 64)
		if s.typ != "DELETED" || s.name != fmt.Sprint("cm-", i) || r <= last {
			t.Fatalf("event %d: %s %s at %s, want DELETED cm-%d after RV %d (all: %v)", i, s.typ, s.name, s.rv, i, last, got)
		}
		last = r
	}
	if int64(len(got)) < n-1 {
		t.Errorf("%d events from %d upstream requests: each resume delivers one", len(got), n)
	}
	if w := p.Metric("watchsan_watch_resume_brake_seconds_count", nil); n > 4 && w == 0 {
		t.Errorf("watchsan_watch_resume_brake_seconds counted no wait")
	}
	p.requireProxied(1, nil)
}

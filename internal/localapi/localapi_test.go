package localapi

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/watchsan/watchsan/internal/testutil"
)

// apiServices is an APIServiceList as the apiserver sends it: local ones without a service.
const apiServices = `{"kind":"APIServiceList","apiVersion":"apiregistration.k8s.io/v1","items":[
 {"metadata":{"name":"v1."},"spec":{"version":"v1","groupPriorityMinimum":18000,"versionPriority":1}},
 {"metadata":{"name":"v1.apps"},"spec":{"group":"apps","version":"v1","groupPriorityMinimum":17800,"versionPriority":15}},
 {"metadata":{"name":"v1.stable.example.com"},"spec":{"group":"stable.example.com","version":"v1"}},
 {"metadata":{"name":"v1beta1.metrics.k8s.io"},"spec":{"group":"metrics.k8s.io","version":"v1beta1","service":{"namespace":"kube-system","name":"metrics-server","port":443}}},
 {"metadata":{"name":"v1.batch"},"spec":{"group":"batch","version":"v1","service":{"namespace":"evil","name":"batch-filter"}}}
]}`

// reader is a Read hook: each call takes its answer from answers (nil: the list above) and is
// counted; reads says each read ended.
type reader struct {
	calls   atomic.Int32
	answers chan error
	reads   chan struct{}
}

func newReader() *reader {
	return &reader{answers: make(chan error, 10), reads: make(chan struct{}, 10)}
}

func (r *reader) read(_ context.Context, into *List) error {
	r.calls.Add(1)
	defer func() { r.reads <- struct{}{} }()
	if err := <-r.answers; err != nil {
		return err
	}
	return json.Unmarshal([]byte(apiServices), into)
}

func (r *reader) waitRead(t *testing.T) {
	t.Helper()
	select {
	case <-r.reads:
	case <-time.After(10 * time.Second):
		t.Fatal("no read within 10s")
	}
}

// settle waits until the catalog recorded the read the hook just ended (it takes the lock after
// Read returns).
func settle(t *testing.T, c *Catalog) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, "the read recorded", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return !c.reading
	})
}

func TestCatalogClassifiesFromAPIServices(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	r := newReader()
	c := New(Options{Read: r.read, Clock: clk})

	// Before any read: Kubernetes' built-in group-versions only.
	r.answers <- nil
	for _, tc := range []struct {
		group, version string
		want           bool
	}{{"", "v1", true}, {"apps", "v1", true}, {"batch", "v1", true}, {"stable.example.com", "v1", false},
		{"metrics.k8s.io", "v1beta1", false}, {"apps", "v9", false}} {
		if got := c.Local(tc.group, tc.version); got != tc.want {
			t.Errorf("before a read: Local(%q, %q) = %v, want %v", tc.group, tc.version, got, tc.want)
		}
	}
	r.waitRead(t)
	settle(t, c)
	if n := r.calls.Load(); n != 1 {
		t.Fatalf("%d reads for the first questions, want 1", n)
	}

	// After it: the cluster's word, a proxied built-in group included.
	for _, tc := range []struct {
		group, version string
		want           bool
	}{{"", "v1", true}, {"apps", "v1", true}, {"stable.example.com", "v1", true},
		{"metrics.k8s.io", "v1beta1", false}, {"batch", "v1", false}, {"policy", "v1", false}} {
		if got := c.Local(tc.group, tc.version); got != tc.want {
			t.Errorf("after a read: Local(%q, %q) = %v, want %v", tc.group, tc.version, got, tc.want)
		}
	}
	if n := r.calls.Load(); n != 1 {
		t.Errorf("%d reads within the refresh period, want 1", n)
	}

	// A refresh period later, the next question reads again; a failed read keeps the last
	// good one until it is MaxAge old, then only the built-in group-versions count.
	clk.Step(DefaultRefresh)
	r.answers <- errors.New("apiserver answered 403")
	c.Local("apps", "v1")
	r.waitRead(t)
	settle(t, c)
	if n := r.calls.Load(); n != 2 {
		t.Fatalf("%d reads after a refresh period, want 2", n)
	}
	if !c.Local("stable.example.com", "v1") || c.Local("batch", "v1") {
		t.Error("a failed read dropped the last good one before MaxAge")
	}
	clk.Step(DefaultMaxAge)
	r.answers <- errors.New("apiserver answered 403")
	if c.Local("stable.example.com", "v1") || !c.Local("batch", "v1") {
		t.Error("past MaxAge without a good read: want the built-in group-versions only")
	}
	r.waitRead(t)
	settle(t, c)
}

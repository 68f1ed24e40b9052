package review

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	authorizationv1 "k8s.io/api/authorization/v1"
	testclock "k8s.io/utils/clock/testing"

	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/internal/upstream"
)

// apiserver answers reviews: allowed for the namespaces in allow, and counts them.
type apiserver struct {
	mu    sync.Mutex
	allow map[string]bool
	sent  int
}

func (a *apiserver) Do(ctx context.Context, req *http.Request, plan upstream.Plan) (upstream.Attempt, error) {
	var ssar authorizationv1.SelfSubjectAccessReview
	if err := json.NewDecoder(req.Body).Decode(&ssar); err != nil {
		return upstream.Attempt{}, err
	}
	a.mu.Lock()
	a.sent++
	ssar.Status.Allowed = a.allow[ssar.Spec.ResourceAttributes.Namespace] && ssar.Spec.ResourceAttributes.Verb == "watch"
	a.mu.Unlock()
	b, _ := json.Marshal(&ssar)
	return upstream.Attempt{Resp: &http.Response{StatusCode: http.StatusCreated, Status: "201 Created", Header: http.Header{},
		Body: io.NopCloser(strings.NewReader(string(b)))}, Cancel: func(error) {}}, nil
}

func (a *apiserver) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sent
}

func newCache(t *testing.T, max int, a Attempter) (*Cache, *testclock.FakeClock, *prometheus.CounterVec) {
	t.Helper()
	clk := testclock.NewFakeClock(time.Unix(1e9, 0))
	results := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "reviews"}, []string{"result"})
	return New(max, a, clk, zap.NewNop(), results), clk, results
}

func watchOf(t *testing.T, ns string) (*http.Request, *reqinfo.Info, upstream.Credentials) {
	t.Helper()
	r, _ := http.NewRequest("GET", "/api/v1/namespaces/"+ns+"/configmaps?watch=true&labelSelector=a%3Db", nil)
	r.Header.Set("Authorization", "Bearer alice")
	info := reqinfo.Parse(r)
	return r, &info, upstream.Decide(r.Header, nil, false, upstream.IdentityOff)
}

// No allowance is kept (every request is reviewed again); a denial is, for deniedTTL, then
// reviewed again; the cache keeps at most max denials, oldest out; each result is counted.
func TestCacheKeepsDenialsNotAllowances(t *testing.T) {
	a := &apiserver{allow: map[string]bool{"d": true}}
	c, clk, results := newCache(t, 2, a)
	ask := func(ns, verb string) Verdict {
		r, info, cred := watchOf(t, ns)
		if !NeedsReview(cred) {
			t.Fatal("a client's own token is reviewed")
		}
		return c.Review(context.Background(), r, info, cred, CredentialsKey(r, cred), verb)
	}
	if v := ask("d", "watch"); v != Allowed {
		t.Fatalf("allowed namespace: %v", v)
	}
	if v := ask("d", "watch"); v != Allowed || a.count() != 2 {
		t.Fatalf("again: %v, %d reviews sent; want allowed by a second review", v, a.count())
	}
	if v := ask("d", "list"); v != Denied || a.count() != 3 {
		t.Fatalf("list: %v, %d reviews; want denied by a review of its own", v, a.count())
	}
	if v := ask("e", "watch"); v != Denied || a.count() != 4 {
		t.Fatalf("denied namespace: %v, %d reviews", v, a.count())
	}
	if v := ask("e", "watch"); v != Denied || a.count() != 4 || promtest.ToFloat64(results.WithLabelValues(ResultCachedDeny)) != 1 {
		t.Fatalf("denied again: %v, %d reviews; want the kept denial", v, a.count())
	}
	clk.Step(deniedTTL + time.Second)
	if v := ask("e", "watch"); v != Denied || a.count() != 5 {
		t.Fatalf("after the TTL: %v, %d reviews; want a new review", v, a.count())
	}
	ask("f", "watch")
	ask("g", "watch")
	if n := c.Size().Denied; n != 2 {
		t.Fatalf("%d denials kept, want the bound, 2", n)
	}
	if got := promtest.ToFloat64(results.WithLabelValues(ResultAllowed)); got != 2 {
		t.Fatalf("allowed counted %v, want 2", got)
	}
}

// A request whose client left before the answer is told so, and the review no one waits for
// counts for nothing.
func TestCacheClientGone(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	c, _, results := newCache(t, 0, attempterFunc(func(ctx context.Context) (upstream.Attempt, error) {
		select {
		case <-block:
		case <-ctx.Done():
		}
		return upstream.Attempt{}, ctx.Err()
	}))
	r, info, cred := watchOf(t, "d")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if v := c.Review(ctx, r, info, cred, CredentialsKey(r, cred), "watch"); v != ClientGone {
		t.Fatalf("%v, want ClientGone", v)
	}
	testutil.Eventually(t, 10*time.Second, "the abandoned review ended", func() bool { return c.Size().Flights == 0 })
	for _, res := range Results {
		if got := promtest.ToFloat64(results.WithLabelValues(res)); got != 0 {
			t.Fatalf("%s counted %v for an abandoned review", res, got)
		}
	}
}

type attempterFunc func(ctx context.Context) (upstream.Attempt, error)

func (f attempterFunc) Do(ctx context.Context, _ *http.Request, _ upstream.Plan) (upstream.Attempt, error) {
	return f(ctx)
}

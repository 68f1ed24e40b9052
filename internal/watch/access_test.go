package watch

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/review"
	"github.com/watchsan/watchsan/internal/testutil"
)

// authAPI is the apiserver's authentication and authorization in front of a memapi, as far as
// these tests need them: a bearer token names a user (an unknown one is answered 401), a user
// may get, list and watch in its namespaces (else 403), optionally only with one field
// selector (as the Node authorizer lets a kubelet watch its own pods only), and a
// SelfSubjectAccessReview is answered for the user the request authenticates as, by the same
// rule, the way the apiserver answers one: 201 with status.allowed.
type authAPI struct {
	next http.Handler

	mu      sync.Mutex
	users   map[string]*authUser // by token
	reviews []authorizationv1.ResourceAttributes
	tokens  []string      // the token of every watch that reached next
	hold    chan struct{} // when set, every review waits for it to close
}

type authUser struct {
	namespaces map[string]bool // "*": all
	// field, if set, is the one fieldSelector its watches and lists are allowed with.
	field string
	// noList: it may watch and get, not list (a role with watch and no list).
	noList bool
}

func newAuthAPI(next http.Handler) *authAPI {
	return &authAPI{next: next, users: map[string]*authUser{
		"lent":  {namespaces: map[string]bool{"*": true}},
		"alice": {namespaces: map[string]bool{"d": true}},
		"bob":   {namespaces: map[string]bool{"d": true}},
		"carol": {namespaces: map[string]bool{}},
		"node":  {namespaces: map[string]bool{"d": true}, field: "metadata.name=cm-1"},
		"dave":  {namespaces: map[string]bool{"d": true}, noList: true},
		// TestFeedsListing's client with a token of its own: reviewed, its feed listed
		"s3cret-t0ken": {namespaces: map[string]bool{"d": true}},
	}}
}

func (u *authUser) may(ra *authorizationv1.ResourceAttributes) bool {
	switch ra.Verb {
	case "get", "list", "watch":
	default:
		return false
	}
	if u.noList && ra.Verb == "list" {
		return false
	}
	if !u.namespaces["*"] && !u.namespaces[ra.Namespace] {
		return false
	}
	return u.field == "" || ra.FieldSelector != nil && ra.FieldSelector.RawSelector == u.field
}

func (a *authAPI) revoke(token string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.users, token)
}

// unbind takes every right of token's user away (its RoleBindings deleted); it still
// authenticates.
func (a *authAPI) unbind(token string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.users[token] = &authUser{namespaces: map[string]bool{}}
}

func (a *authAPI) sent() []authorizationv1.ResourceAttributes {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]authorizationv1.ResourceAttributes(nil), a.reviews...)
}

func (a *authAPI) watchTokens() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.tokens...)
}

func writeStatus(w http.ResponseWriter, st metav1.Status) {
	st.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(int(st.Code))
	_ = json.NewEncoder(w).Encode(&st)
}

func (a *authAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	token := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	a.mu.Lock()
	u := a.users[token]
	if imp := r.Header.Get("Impersonate-User"); imp != "" && u != nil && u.namespaces["*"] {
		// Only an identity with every right (the lent one) may impersonate; the impersonated
		// user has the rights its own token would, none when it has none.
		if u = a.users[imp]; u == nil {
			u = &authUser{namespaces: map[string]bool{}}
		}
	}
	hold := a.hold
	a.mu.Unlock()
	if u == nil {
		writeStatus(w, apierrors.NewUnauthorized("Unauthorized").ErrStatus)
		return
	}
	if r.Method == http.MethodPost && r.URL.Path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews" {
		var ssar authorizationv1.SelfSubjectAccessReview
		if err := json.NewDecoder(r.Body).Decode(&ssar); err != nil || ssar.Spec.ResourceAttributes == nil {
			writeStatus(w, apierrors.NewBadRequest(fmt.Sprintf("not a review: %v", err)).ErrStatus)
			return
		}
		a.mu.Lock()
		a.reviews = append(a.reviews, *ssar.Spec.ResourceAttributes)
		a.mu.Unlock()
		if hold != nil {
			<-hold
		}
		ssar.Status.Allowed = u.may(ssar.Spec.ResourceAttributes)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Audit-Id", "review-1")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(&ssar)
		return
	}
	info := reqinfo.Parse(r)
	ra := review.Attributes(r, &info)
	ra.Verb = info.Verb
	if !u.may(ra) {
		writeStatus(w, apierrors.NewForbidden(schema.GroupResource{Group: info.APIGroup, Resource: info.Resource}, info.Name, fmt.Errorf("not allowed")).ErrStatus)
		return
	}
	if info.IsWatch() {
		a.mu.Lock()
		a.tokens = append(a.tokens, token)
		n := len(a.tokens)
		a.mu.Unlock()
		// What the apiserver says of the request itself: its audit id and APF classification.
		w.Header().Set("Audit-Id", fmt.Sprintf("audit-%s-%d", token, n))
		w.Header().Set("X-Kubernetes-Pf-Flowschema-Uid", "flowschema-of-"+token)
		w.Header().Set("X-Kubernetes-Pf-Prioritylevel-Uid", "prioritylevel-of-"+token)
	}
	a.next.ServeHTTP(w, r)
}

func bearer(token string) http.Header { return http.Header{"Authorization": {"Bearer " + token}} }

// answer is a watch's whole answer when it is no stream: its status and (bounded) body.
func answer(t *testing.T, url string, hdr http.Header) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Fatalf("%s: 200, want a refusal", url)
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(b)
}

func (x *shareFixture) reviews(result string) float64 {
	return promtest.ToFloat64(x.m.SharedAccessReviews.WithLabelValues(result))
}

// Clients with tokens of their own, each allowed by the apiserver to watch the scope of a
// resource it serves itself, share one upstream watch, and each gets what a direct watch gets;
// every join cost a review, the second with the same token too (no allowance is reused). The
// lent identity's watch of the same scope is a feed of its own: it was never reviewed.
func TestShareReviewedTokensShareOneWatch(t *testing.T) {
	x := newShareFixture(t, Config{})
	from := x.write(t, "before", 1, 10)
	q := "resourceVersion=" + rv(from)
	clients := []*client{watchAt(t, x.srv.URL, q, bearer("alice"), true), watchAt(t, x.srv.URL, q, bearer("bob"), true),
		watchAt(t, x.srv.URL, q, bearer("alice"), true)}
	direct := watchAt(t, x.direct.URL, q, nil, true)
	x.waitSubscribers(t, 3)
	x.write(t, "cm", 5, 10)
	want := direct.waitFor(t, "the direct watch", 5)
	for i, c := range clients {
		sameEvents(t, fmt.Sprintf("client %d", i), c.waitFor(t, fmt.Sprintf("client %d", i), 5), want)
	}
	if got := x.gate.watches.Load(); got != 1 {
		t.Errorf("%d upstream watches for 3 allowed token clients, want 1", got)
	}
	if got := x.auth.watchTokens(); len(got) != 1 || got[0] != "alice" {
		t.Errorf("the feed's watch went with %v, want its opener's token (alice)", got)
	}
	sent := x.auth.sent()
	if len(sent) != 3 || x.reviews(review.ResultAllowed) != 3 {
		t.Errorf("%d reviews sent (%v allowed), want 3: one per join", len(sent), x.reviews(review.ResultAllowed))
	}
	for _, ra := range sent {
		want := authorizationv1.ResourceAttributes{Verb: "watch", Version: "v1", Resource: "configmaps", Namespace: "d"}
		if ra != want {
			t.Errorf("review of %+v, want %+v", ra, want)
		}
	}
	lent := watchAt(t, x.srv.URL, q, nil, true)
	x.waitSubscribers(t, 4)
	x.write(t, "after", 1, 10)
	lent.waitFor(t, "the lent client", 1)
	if got := x.gate.watches.Load(); got != 2 {
		t.Errorf("%d upstream watches with a lent client besides, want 2 (the lent and the reviewed feed)", got)
	}
}

// A token without RBAC for the scope, and one allowed elsewhere only, get the apiserver's own
// 403, an unknown token its 401: not one byte of the feed open for the scope.
func TestShareRefusedTokenGetsTheApiserversAnswer(t *testing.T) {
	x := newShareFixture(t, Config{})
	from := x.write(t, "before", 1, 10)
	q := "resourceVersion=" + rv(from)
	alice := watchAt(t, x.srv.URL, q, bearer("alice"), true)
	x.waitSubscribers(t, 1)
	x.write(t, "cm", 3, 10)
	alice.waitFor(t, "alice", 3)
	for _, c := range []struct {
		token, ns string
		code      int
		reason    metav1.StatusReason
	}{
		{"carol", "d", http.StatusForbidden, metav1.StatusReasonForbidden},
		{"alice", "e", http.StatusForbidden, metav1.StatusReasonForbidden},
		{"mallory", "d", http.StatusUnauthorized, metav1.StatusReasonUnauthorized},
	} {
		code, body := answer(t, x.srv.URL+"/api/v1/namespaces/"+c.ns+"/configmaps?watch=true&"+q, bearer(c.token))
		var st metav1.Status
		if code != c.code || json.Unmarshal([]byte(body), &st) != nil || st.Kind != "Status" || st.Reason != c.reason {
			t.Errorf("%s watching %s: %d %s, want the apiserver's %d %s", c.token, c.ns, code, body, c.code, c.reason)
		}
		if strings.Contains(body, "ConfigMap") {
			t.Errorf("%s watching %s got a byte of a feed: %s", c.token, c.ns, body)
		}
	}
	if got := promtest.ToFloat64(x.m.PrivateFeeds.WithLabelValues(privateDenied)); got != 3 {
		t.Errorf("private feeds (access-denied) %v, want 3", got)
	}
	if x.reviews(review.ResultDenied) != 2 || x.reviews(review.ResultUnauthorized) != 1 {
		t.Errorf("reviews denied %v, unauthorized %v, want 2 and 1", x.reviews(review.ResultDenied), x.reviews(review.ResultUnauthorized))
	}
	if got := promtest.ToFloat64(x.m.SharedSubscribers); got != 1 {
		t.Errorf("%v subscribers, want alice's alone", got)
	}
}

// No allowance is reused: RBAC refuses at once what it no longer allows, so every join is
// reviewed again; a denial is kept 30 seconds on the watch's clock (a FakeClock whose
// AfterFuncs run on goroutines of their own: stepClock), since it only sends a watch to a
// private feed, where the apiserver answers it.
func TestShareReviewAllowanceNotReusedDenialKept(t *testing.T) {
	clk := newStepClock()
	x := newShareFixtureClock(t, Config{}, clk)
	from := x.write(t, "before", 1, 10)
	q := "resourceVersion=" + rv(from)
	sent := func(want int, what string) {
		t.Helper()
		if got := len(x.auth.sent()); got != want {
			t.Fatalf("%s: %d reviews sent, want %d", what, got, want)
		}
	}
	for i := 1; i <= 3; i++ {
		watchAt(t, x.srv.URL, q, bearer("alice"), true).cancel()
		sent(i, fmt.Sprintf("alice's watch %d", i))
		clk.Step(time.Second)
	}

	carol := x.srv.URL + "/api/v1/namespaces/d/configmaps?watch=true&" + q
	for i := 0; i < 2; i++ {
		if code, _ := answer(t, carol, bearer("carol")); code != http.StatusForbidden {
			t.Errorf("carol: %d, want 403", code)
		}
	}
	sent(4, "carol's two watches within 30 s")
	clk.Step(29 * time.Second)
	answer(t, carol, bearer("carol"))
	sent(4, "carol's watch 29 s after")
	clk.Step(2 * time.Second)
	answer(t, carol, bearer("carol"))
	sent(5, "carol's watch 31 s after her denial")
	if x.reviews(review.ResultAllowed) != 3 || x.reviews(review.ResultCachedDeny) != 2 {
		t.Errorf("allowed %v, cached-denied %v, want 3 and 2", x.reviews(review.ResultAllowed), x.reviews(review.ResultCachedDeny))
	}
}

// The review carries the watch's selectors (and the name a metadata.name selector names), so a
// client allowed a watch only with its own field selector (a kubelet's spec.nodeName) is
// allowed that watch and refused the same one without it.
func TestShareReviewCarriesSelectors(t *testing.T) {
	x := newShareFixture(t, Config{})
	from := x.write(t, "cm", 3, 10)
	q := "fieldSelector=metadata.name%3Dcm-1&labelSelector=app%21%3Dx&resourceVersion=" + rv(from-2)
	node := watchAt(t, x.srv.URL, q, bearer("node"), true)
	direct := watchAt(t, x.direct.URL, q, nil, true)
	x.waitSubscribers(t, 1)
	sameEvents(t, "the node's watch", node.waitFor(t, "the node's watch", 1), direct.waitFor(t, "its direct watch", 1))
	sent := x.auth.sent()
	want := authorizationv1.ResourceAttributes{Verb: "watch", Version: "v1", Resource: "configmaps", Namespace: "d", Name: "cm-1",
		FieldSelector: &authorizationv1.FieldSelectorAttributes{RawSelector: "metadata.name=cm-1"},
		LabelSelector: &authorizationv1.LabelSelectorAttributes{RawSelector: "app!=x"}}
	if len(sent) != 1 || fmt.Sprintf("%+v %+v %+v", sent[0], *sent[0].FieldSelector, *sent[0].LabelSelector) !=
		fmt.Sprintf("%+v %+v %+v", want, *want.FieldSelector, *want.LabelSelector) {
		t.Errorf("reviews %+v, want one of %+v", sent, want)
	}
	if code, _ := answer(t, x.srv.URL+"/api/v1/namespaces/d/configmaps?watch=true&resourceVersion="+rv(from), bearer("node")); code != http.StatusForbidden {
		t.Errorf("the node's watch without its field selector: %d, want 403", code)
	}
}

// The feed goes with its opener's token. Once the apiserver refuses it (revoked: the feed's
// resume is answered 401), every subscriber's stream ends cleanly, no ERROR, no event more;
// each re-watches with its own credentials, reviewed again: the revoked one gets its 401, the
// other opens a new feed, with its own token, where it left off.
func TestShareOpenersRevokedTokenEndsTheFeedCleanly(t *testing.T) {
	x := newShareFixture(t, Config{})
	from := x.write(t, "before", 1, 10)
	q := "resourceVersion=" + rv(from)
	alice := watchAt(t, x.srv.URL, q, bearer("alice"), true)
	x.waitSubscribers(t, 1) // alice opens the feed
	bob := watchAt(t, x.srv.URL, q, bearer("bob"), true)
	x.waitSubscribers(t, 2)
	last := x.write(t, "cm", 2, 10)
	alice.waitFor(t, "alice", 2)
	bob.waitFor(t, "bob", 2)

	x.auth.revoke("alice")
	x.gate.breakAll()
	for name, c := range map[string]*client{"alice": alice, "bob": bob} {
		select {
		case <-c.ended:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s's stream still open 20 s after the feed's watch was refused", name)
		}
		if got := c.events(); len(got) != 2 {
			t.Errorf("%s got %v, want its 2 events and a clean end", name, got)
		}
	}
	testutil.Eventually(t, 10*time.Second, "the feed ended", func() bool { return promtest.ToFloat64(x.m.SharedFeeds) == 0 })
	// A detached member counts its end after it wrote the last chunk its client read, and
	// closed the connection: just after the client saw the end, not before.
	testutil.Eventually(t, 10*time.Second, "both stream ends (resume-refused) counted", func() bool {
		return promtest.ToFloat64(x.m.StreamEnds.WithLabelValues(EndResumeRefused.String())) == 2
	})

	if code, _ := answer(t, x.srv.URL+"/api/v1/namespaces/d/configmaps?watch=true&resourceVersion="+rv(last), bearer("alice")); code != http.StatusUnauthorized {
		t.Errorf("alice's re-watch: %d, want 401", code)
	}
	bob = watchAt(t, x.srv.URL, "resourceVersion="+rv(last), bearer("bob"), true)
	x.waitSubscribers(t, 1)
	x.write(t, "after", 1, 10)
	if got := bob.waitFor(t, "bob's re-watch", 1); len(got) != 1 || !strings.Contains(got[0], "after-0") {
		t.Errorf("bob's re-watch got %v, want the one event after", got)
	}
	if got := x.auth.watchTokens(); len(got) != 2 || got[0] != "alice" || got[1] != "bob" {
		t.Errorf("watches that reached the apiserver went with %v, want alice's feed, then bob's new one (the refused resume is refused before)", got)
	}
	if x.reviews(review.ResultUnauthorized) != 1 || x.reviews(review.ResultAllowed) != 3 {
		t.Errorf("alice's re-watch: unauthorized %v; allowed %v (alice's, bob's and bob's re-watch); want 1 and 3", x.reviews(review.ResultUnauthorized), x.reviews(review.ResultAllowed))
	}
}

// Identical reviews coalesce, but never onto one that began before a watch arrived (its answer
// may predate a revocation): bob's feed is open; alice's watch 1's review is on the wire when
// her RoleBinding is deleted and watches 2 and 3 arrive; they wait for the next review, one for
// both, sent once the first is answered, and get the apiserver's 403, while watch 1 joins with
// the answer its review got. So at most two reviews serve any number of identical watches.
func TestShareReviewsCoalesceOnlyOntoLaterReviews(t *testing.T) {
	x := newShareFixture(t, Config{})
	from := x.write(t, "before", 1, 10)
	watchAt(t, x.srv.URL, "resourceVersion="+rv(from), bearer("bob"), true)
	x.waitSubscribers(t, 1)
	hold := make(chan struct{})
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(hold) }) }
	t.Cleanup(release) // a failed wait below must not leave the review held
	x.auth.mu.Lock()
	x.auth.hold = hold
	x.auth.mu.Unlock()
	const n = 3
	codes := make([]chan int, n)
	watch := func(i int) {
		codes[i] = make(chan int, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", x.srv.URL+"/api/v1/namespaces/d/configmaps?watch=true&timeoutSeconds=1&resourceVersion="+rv(from), nil)
			req.Header = bearer("alice")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				codes[i] <- 0
				return
			}
			resp.Body.Close()
			codes[i] <- resp.StatusCode
		}()
	}
	flight := func() (sent, next int) {
		s := x.h.reviews.Size()
		return s.Sent, s.Next
	}
	watch(0)
	// On the wire and arrived (the apiserver took it for alice, bound, before the unbind): bob's
	// review and watch 1's.
	testutil.Eventually(t, 10*time.Second, "watch 1's review on the wire", func() bool { s, _ := flight(); return s == 1 && len(x.auth.sent()) == 2 })
	x.auth.unbind("alice")
	for i := 1; i < n; i++ {
		watch(i)
	}
	testutil.Eventually(t, 10*time.Second, fmt.Sprintf("%d watches waiting for the next review", n-1), func() bool {
		s, next := flight()
		return s == 1 && next == n-1
	})
	release()
	if code := <-codes[0]; code != http.StatusOK {
		t.Errorf("watch 1, reviewed before the revocation: %d, want 200", code)
	}
	for i := 1; i < n; i++ {
		if code := <-codes[i]; code != http.StatusForbidden {
			t.Errorf("watch %d, arrived after the revocation: %d, want the apiserver's 403", i+1, code)
		}
	}
	if got := len(x.auth.sent()); got != 3 {
		t.Errorf("%d reviews sent for bob and %d identical watches of alice, want 3", got, n)
	}
	if x.reviews(review.ResultAllowed) != 2 || x.reviews(review.ResultDenied) != 1 || x.reviews(review.ResultCoalesced) != n-1 {
		t.Errorf("allowed %v, denied %v, coalesced %v, want 2 (bob, watch 1), 1 and %d", x.reviews(review.ResultAllowed), x.reviews(review.ResultDenied), x.reviews(review.ResultCoalesced), n-1)
	}
}

// A review whose watches all left (reset streams) is cancelled and counts for nothing, and the
// watch is no private feed either: a rapid reset costs at most the review already sent.
func TestShareReviewAbandonedByResetCountsNothing(t *testing.T) {
	x := newShareFixture(t, Config{})
	from := x.write(t, "before", 1, 10)
	hold := make(chan struct{})
	defer close(hold)
	x.auth.mu.Lock()
	x.auth.hold = hold
	x.auth.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", x.srv.URL+"/api/v1/namespaces/d/configmaps?watch=true&resourceVersion="+rv(from), nil)
	req.Header = bearer("alice")
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	testutil.Eventually(t, 10*time.Second, "the review on the wire", func() bool { return len(x.auth.sent()) == 1 })
	cancel()
	<-done
	testutil.Eventually(t, 10*time.Second, "the abandoned review ended", func() bool {
		return x.h.reviews.Size().Flights == 0
	})
	for _, r := range review.Results {
		if got := x.reviews(r); got != 0 {
			t.Errorf("reviews %s: %v, want none counted", r, got)
		}
	}
	for _, r := range PrivateFeedReasons {
		if got := promtest.ToFloat64(x.m.PrivateFeeds.WithLabelValues(r)); got != 0 {
			t.Errorf("private feeds %s: %v, want none", r, got)
		}
	}
	if got := x.gate.watches.Load(); got != 0 {
		t.Errorf("%d upstream watches for a watch reset during its review, want 0", got)
	}
}

// The cache is bounded, oldest out.
func TestShareReviewCacheBounded(t *testing.T) {
	x := newShareFixture(t, Config{ShareReviewEntries: 2})
	from := x.write(t, "before", 1, 10)
	for _, ns := range []string{"d", "e", "f", "d"} {
		answer(t, x.srv.URL+"/api/v1/namespaces/"+ns+"/configmaps?watch=true&resourceVersion="+rv(from), bearer("carol"))
	}
	if got := len(x.auth.sent()); got != 4 {
		t.Errorf("%d reviews sent, want 4: the first (d) was out of a cache of 2 by the third", got)
	}
	if n := x.h.reviews.Size().Denied; n != 2 {
		t.Errorf("%d cached denials, want 2", n)
	}
}

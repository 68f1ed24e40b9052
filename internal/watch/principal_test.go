package watch

import (
	"net/http"
	"strings"
	"testing"

	"github.com/watchsan/watchsan/internal/review"
)

// Who shares with whom (docs/design.md section 11): what decides the apiserver's answer
// decides the feed.

// An aggregated API (Deps.ServedLocally false) receives the user and may answer each one
// differently: clients with their own tokens share only with the same token, each join still
// reviewed.
func TestShareAggregatedSharesOnlyWithinOnePrincipal(t *testing.T) {
	x := newShareFixture(t, Config{})
	x.aggregated.Store(true)
	from := x.write(t, "before", 1, 10)
	q := "resourceVersion=" + rv(from)
	alice := watchAt(t, x.srv.URL, q, bearer("alice"), true)
	bob := watchAt(t, x.srv.URL, q, bearer("bob"), true)
	alice2 := watchAt(t, x.srv.URL, q, bearer("alice"), true)
	x.waitSubscribers(t, 3)
	x.write(t, "cm", 2, 10)
	for name, c := range map[string]*client{"alice": alice, "bob": bob, "alice again": alice2} {
		c.waitFor(t, name, 2)
	}
	if got := x.gate.watches.Load(); got != 2 {
		t.Errorf("%d upstream watches, want 2: alice's feed (both of her watches) and bob's own", got)
	}
	if got := x.auth.watchTokens(); len(got) != 2 || got[0] != "alice" || got[1] != "bob" {
		t.Errorf("upstream watches went with %v, want alice's then bob's own token", got)
	}
	if got := len(x.auth.sent()); got != 3 {
		t.Errorf("%d reviews, want 3: every join is reviewed, one principal's too", got)
	}
}

// A lent request with Impersonate-* headers is the impersonated identity to the apiserver: it
// never joins the lent identity's feed. One impersonating a user without rights gets the
// apiserver's 403, not a byte of the feed that covers its resourceVersion; one impersonating an
// allowed user is reviewed as that user (the review carries its impersonation) and gets a feed
// that goes upstream as it.
func TestShareLentImpersonationNeverJoinsTheLentFeed(t *testing.T) {
	x := newShareFixture(t, Config{})
	from := x.write(t, "before", 1, 10)
	q := "resourceVersion=" + rv(from)
	lent := watchAt(t, x.srv.URL, q, nil, true)
	x.waitSubscribers(t, 1)
	x.write(t, "cm", 2, 10)
	lent.waitFor(t, "the lent watch", 2)

	for _, hdr := range []http.Header{
		{"Impersonate-User": {"carol"}},
		{"Impersonate-User": {"nobody"}, "Impersonate-Group": {"system:masters"}},
	} {
		code, body := answer(t, x.srv.URL+"/api/v1/namespaces/d/configmaps?watch=true&"+q, hdr)
		if code != http.StatusForbidden || strings.Contains(body, "ConfigMap") {
			t.Errorf("lent watch with %v: %d %s, want the apiserver's 403 and no event", hdr, code, body)
		}
	}
	if got := x.gate.watches.Load(); got != 1 {
		t.Errorf("%d upstream watches, want the lent feed's alone (the refused ones are refused before)", got)
	}

	asAlice := watchAt(t, x.srv.URL, q, http.Header{"Impersonate-User": {"alice"}}, true)
	x.waitSubscribers(t, 2)
	x.write(t, "after", 1, 10)
	asAlice.waitFor(t, "the watch impersonating alice", 3)
	if got := x.gate.watches.Load(); got != 2 {
		t.Errorf("%d upstream watches, want 2: the lent feed and the one impersonating alice", got)
	}
	if got := x.reviews(review.ResultAllowed); got != 1 {
		t.Errorf("%v allowed reviews, want alice's (the impersonating watch was reviewed)", got)
	}
}

// A joiner's response headers are its own: the opener's audit id and APF classification
// (an admin's flow schema is exempt) stay the opener's.
func TestShareJoinerGetsNoOpenersRequestHeaders(t *testing.T) {
	x := newShareFixture(t, Config{})
	from := x.write(t, "before", 1, 10)
	q := "resourceVersion=" + rv(from)
	alice := watchAt(t, x.srv.URL, q, bearer("alice"), true)
	x.waitSubscribers(t, 1)
	bob := watchAt(t, x.srv.URL, q, bearer("bob"), true)
	x.waitSubscribers(t, 2)
	if got := alice.header.Get("X-Kubernetes-Pf-Flowschema-Uid"); got != "flowschema-of-alice" {
		t.Errorf("the opener's flow schema %q, want its own", got)
	}
	for _, k := range []string{"Audit-Id", "X-Kubernetes-Pf-Flowschema-Uid", "X-Kubernetes-Pf-Prioritylevel-Uid"} {
		if v := bob.header.Values(k); len(v) > 0 {
			t.Errorf("the joiner's response carries %s %v, the opener's", k, v)
		}
	}
	if ct := bob.header.Get("Content-Type"); ct != alice.header.Get("Content-Type") || ct == "" {
		t.Errorf("the joiner's Content-Type %q, want the stream's %q", ct, alice.header.Get("Content-Type"))
	}
}

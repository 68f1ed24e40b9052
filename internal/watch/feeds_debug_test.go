package watch

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/watchsan/watchsan/internal/testutil"
)

// listing is what /debug/feeds answers (ServeFeeds), as a client reads it, and its body.
func (x *shareFixture) listing(t *testing.T) (FeedsListing, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	x.h.ServeFeeds(rec, httptest.NewRequest(http.MethodGet, "/debug/feeds", nil))
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("/debug/feeds: %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	var l FeedsListing
	if err := json.Unmarshal(rec.Body.Bytes(), &l); err != nil {
		t.Fatalf("/debug/feeds: %v: %s", err, rec.Body)
	}
	return l, rec.Body.String()
}

// /debug/feeds lists an open feed with what it watches, its subscribers and its ring, as two
// clients joined it and it delivered; it never shows the feed's key, the principal in it (the
// lent identity's "lent", a reviewed feed's "reviewed") or any client's credentials: the feed
// of a client with a token of its own, which the access review let share, is listed as any
// other, and nothing of its token is.
func TestFeedsListing(t *testing.T) {
	x := newShareFixture(t, Config{})
	from := x.write(t, "before", 1, 10)
	q := "resourceVersion=" + rv(from) + "&labelSelector=app%3Dweb"
	a := watchAt(t, x.srv.URL, q, nil, true)
	b := watchAt(t, x.srv.URL, q, http.Header{"Accept": {"application/json"}}, true)             // another key: another feed
	own := watchAt(t, x.srv.URL, q, http.Header{"Authorization": {"Bearer s3cret-t0ken"}}, true) // reviewed: a feed of its own
	x.waitSubscribers(t, 3)
	c := watchAt(t, x.srv.URL, q, nil, true) // joins a's feed
	x.waitSubscribers(t, 4)
	for i := 0; i < 3; i++ {
		body := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"web-` + rv(uint64(i)) + `","labels":{"app":"web"}}}`
		resp, err := http.Post(x.direct.URL+"/api/v1/namespaces/d/configmaps", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	last := x.api.ResourceVersion()
	for _, cl := range []*client{a, b, own, c} {
		cl.waitFor(t, "a client", 3)
	}
	var l FeedsListing
	var body string
	testutil.Eventually(t, 10*time.Second, "the listing to show the three feeds' deliveries", func() bool {
		l, body = x.listing(t)
		return len(l.Feeds) == 3 && l.Feeds[0].Ring.Events == 3 && l.Feeds[1].Ring.Events == 3 && l.Feeds[2].Ring.Events == 3
	})
	if !l.Sharing || l.Open != 3 || l.More != 0 || l.MaxFeeds != DefaultShareMaxFeeds {
		t.Errorf("listing header %+v", l)
	}
	f := l.Feeds[0] // the oldest: a's, which c joined
	if f.Subscribers != 2 || l.Feeds[1].Subscribers != 1 || l.Feeds[2].Subscribers != 1 {
		t.Errorf("subscribers %d, %d and %d, want 2, 1 and 1", f.Subscribers, l.Feeds[1].Subscribers, l.Feeds[2].Subscribers)
	}
	if f.Group != "" || f.Version != "v1" || f.Resource != "configmaps" || f.Namespace != "d" || f.Name != "" ||
		f.LabelSelector != "app=web" || f.FieldSelector != "" || f.Format != "json" || f.Opening {
		t.Errorf("what the feed watches: %+v", f)
	}
	if f.Ring.FromRV != rv(from) || f.Ring.ToRV != rv(last) || f.Ring.Bytes < 3*50 || f.LastDeliveredRV != rv(last) || !f.Joinable {
		t.Errorf("ring %+v, last delivered %s, joinable %v; want from %d to %d", f.Ring, f.LastDeliveredRV, f.Joinable, from, last)
	}
	if !strings.HasPrefix(f.Backend, "http://127.0.0.1:") || f.Events < 3 || f.Resumes != 0 || f.AgeSeconds <= 0 {
		t.Errorf("backend %q, events %d, resumes %d, age %v", f.Backend, f.Events, f.Resumes, f.AgeSeconds)
	}
	for _, secret := range []string{"lent", "reviewed", "s3cret", "Bearer", "as=", "accept=", `\u0000`, "Authorization"} {
		if strings.Contains(body, secret) {
			t.Errorf("/debug/feeds shows %q:\n%s", secret, body)
		}
	}

	// The resume is the feed's, once for its subscribers, and the listing says so.
	x.gate.breakAll()
	testutil.Eventually(t, 10*time.Second, "the listing to show the feeds' resumes", func() bool {
		l, _ = x.listing(t)
		return len(l.Feeds) == 3 && l.Feeds[0].Resumes == 1 && l.Feeds[1].Resumes == 1 && l.Feeds[2].Resumes == 1
	})
}

// The listing is bounded: the oldest feeds first, the count of the others given.
func TestFeedsListingBounded(t *testing.T) {
	x := newShareFixture(t, Config{})
	from := x.write(t, "before", 1, 10)
	for _, name := range []string{"a", "b", "c"} {
		watchAt(t, x.srv.URL, "resourceVersion="+rv(from)+"&fieldSelector=metadata.name%3D"+name, nil, true)
		testutil.Eventually(t, 10*time.Second, "feed "+name, func() bool {
			l := x.h.listFeeds(10)
			return len(l.Feeds) > 0 && l.Feeds[len(l.Feeds)-1].Name == name
		})
	}
	l := x.h.listFeeds(2)
	if l.Open != 3 || l.More != 1 || len(l.Feeds) != 2 || l.Feeds[0].Name != "a" || l.Feeds[1].Name != "b" {
		t.Errorf("listing of at most 2: %+v", l)
	}
}

// --share-exclude-resource: watches of an excluded resource never share; each is an upstream
// watch of its own, counted as private with reason excluded, and gets what a direct watch gets.
func TestShareExcludedResource(t *testing.T) {
	x := newShareFixture(t, Config{ShareExclude: []string{"configmaps"}})
	from := x.write(t, "before", 1, 10)
	var clients []*client
	for i := 0; i < 3; i++ {
		clients = append(clients, watchAt(t, x.srv.URL, "resourceVersion="+rv(from), nil, true))
	}
	direct := watchAt(t, x.direct.URL, "resourceVersion="+rv(from), nil, true)
	testutil.Eventually(t, 10*time.Second, "3 private feeds, excluded", func() bool {
		return promtest.ToFloat64(x.m.PrivateFeeds.WithLabelValues(privateExcluded)) == 3
	})
	x.write(t, "cm", 5, 10)
	want := direct.waitFor(t, "the direct watch", 5)
	for _, c := range clients {
		sameEvents(t, "an excluded watch", c.waitFor(t, "an excluded watch", 5), want)
	}
	if got := x.gate.watches.Load(); got != 3 {
		t.Errorf("%d upstream watches for 3 watches of an excluded resource, want 3", got)
	}
	if got := promtest.ToFloat64(x.m.SharedFeeds); got != 0 {
		t.Errorf("%v shared feeds, want none", got)
	}
	if l, _ := x.listing(t); l.Open != 0 {
		t.Errorf("listing %+v, want no feed", l)
	}
}

// --share-max-feeds: with a cap of 1, a second distinct watch gets a private feed (reason
// feed-limit) and still what a direct watch gets; a watch of the open feed still joins it.
func TestShareFeedLimit(t *testing.T) {
	x := newShareFixture(t, Config{ShareMaxFeeds: 1})
	from := x.write(t, "before", 1, 10)
	first := watchAt(t, x.srv.URL, "resourceVersion="+rv(from), nil, true)
	x.waitSubscribers(t, 1)
	q := "resourceVersion=" + rv(from) + "&fieldSelector=metadata.name%3Dcm-2"
	other := watchAt(t, x.srv.URL, q, nil, true)
	testutil.Eventually(t, 10*time.Second, "a private feed, feed-limit", func() bool {
		return promtest.ToFloat64(x.m.PrivateFeeds.WithLabelValues(privateFeedLimit)) == 1
	})
	joiner := watchAt(t, x.srv.URL, "resourceVersion="+rv(from), nil, true)
	x.waitSubscribers(t, 2)
	directOther := watchAt(t, x.direct.URL, q, nil, true)
	x.write(t, "cm", 4, 10)
	first.waitFor(t, "the feed's first client", 4)
	joiner.waitFor(t, "the joiner", 4)
	sameEvents(t, "the watch beyond the cap", other.waitFor(t, "the watch beyond the cap", 1), directOther.waitFor(t, "its direct watch", 1))
	if got := x.gate.watches.Load(); got != 2 {
		t.Errorf("%d upstream watches, want 2 (the feed and the one beyond the cap)", got)
	}
	if l, _ := x.listing(t); l.Open != 1 || l.MaxFeeds != 1 {
		t.Errorf("listing %+v, want one feed of at most 1", l)
	}
}

// The listing's lag is how far a feed's subscribers are behind it: a client that stops reading
// shows as one subscriber behind, by the bytes and frames queued for it and how long the oldest
// has waited; once it reads again, no one is behind.
func TestFeedsListingLag(t *testing.T) {
	x := newShareFixture(t, Config{ShareSubscriberBytes: 64 << 20, WriteTimeout: time.Minute})
	from := x.write(t, "before", 1, 10)
	fast := watchAt(t, x.srv.URL, "resourceVersion="+rv(from), nil, true)
	slow := watchAt(t, x.srv.URL, "resourceVersion="+rv(from), nil, false)
	x.waitSubscribers(t, 2)
	if l, _ := x.listing(t); len(l.Feeds) != 1 || l.Feeds[0].Lag != (FeedLag{}) {
		t.Fatalf("before any write, lag %+v, want none", l.Feeds)
	}
	// More than the kernel's socket buffers hold for the client that does not read, less than
	// its subscriber's bound: its queue holds the rest.
	const n = 300
	x.write(t, "big", n, 64<<10)
	fast.waitFor(t, "the reading client", n)
	var lag FeedLag
	testutil.Eventually(t, 10*time.Second, "the listing to show one subscriber behind", func() bool {
		l, _ := x.listing(t)
		lag = l.Feeds[0].Lag
		return lag.Behind == 1 && lag.MaxSeconds > 0
	})
	if lag.MaxFrames < 1 || lag.MaxBytes < lag.MaxFrames*(64<<10) || lag.MaxBytes > n*(70<<10) {
		t.Errorf("lag %+v: want the slow subscriber's queue, at least a frame of 64 KiB each, at most all %d", lag, n)
	}
	go func() { _, _ = io.Copy(io.Discard, slow.body) }()
	testutil.Eventually(t, 20*time.Second, "no subscriber behind once it reads", func() bool {
		l, _ := x.listing(t)
		return l.Feeds[0].Lag == FeedLag{}
	})
}

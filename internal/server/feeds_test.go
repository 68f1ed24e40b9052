package server

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/watchsan/watchsan/internal/memapi"
	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/internal/watch"
)

// /debug/feeds is on the admin listener, listing the feed two lent clients share (its
// subscribers, its ring), without the lent identity's token or any client's Authorization;
// on the main listener the path is the apiserver's, passed through like every other. With
// --share-max-feeds=1, a watch of another scope is private (feed-limit) and not listed.
func TestDebugFeedsOnAdminOnly(t *testing.T) {
	var mu sync.Mutex
	var upstreamPaths []string
	x := newLendingMemapi(t, func(r *http.Request) {
		mu.Lock()
		upstreamPaths = append(upstreamPaths, r.URL.Path)
		mu.Unlock()
	}, "--share-watches", "--share-max-feeds=1")
	s := x.s
	admin := httptest.NewServer(s.AdminHandler())
	t.Cleanup(admin.Close)
	rv := x.api.ResourceVersion()
	for _, hdr := range []http.Header{{}, {}, {"Authorization": {"Bearer own-s3cret"}}} {
		openConfigmapWatch(t, x.front.URL, rv, "", hdr)
	}
	// --share-max-feeds=1: a watch of another scope would be a second feed; it is private.
	openConfigmapWatch(t, x.front.URL, rv, "&labelSelector=app%3Dother", http.Header{})
	testutil.Eventually(t, 10*time.Second, "a private feed for the feed limit", func() bool {
		return promtest.ToFloat64(s.Metrics().PrivateFeeds.WithLabelValues("feed-limit")) == 1
	})
	testutil.Eventually(t, 10*time.Second, "2 subscribers", func() bool {
		return promtest.ToFloat64(s.Metrics().SharedSubscribers) == 2
	})
	resp, err := admin.Client().Get(admin.URL + "/debug/feeds")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var l watch.FeedsListing
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &l) != nil {
		t.Fatalf("admin /debug/feeds: %s %s", resp.Status, body)
	}
	if !l.Sharing || l.Open != 1 || l.MaxFeeds != 1 || len(l.Feeds) != 1 || l.Feeds[0].Subscribers != 2 ||
		l.Feeds[0].Resource != "configmaps" || l.Feeds[0].Ring.FromRV != fmt.Sprint(rv) {
		t.Errorf("admin /debug/feeds: %s", body)
	}
	for _, secret := range []string{"lent", "own-s3cret", "Bearer", "Authorization"} {
		if strings.Contains(string(body), secret) {
			t.Errorf("/debug/feeds shows %q: %s", secret, body)
		}
	}

	resp, err = http.Get(x.front.URL + "/debug/feeds")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(body), `"feeds"`) || strings.Contains(string(body), `"subscribers"`) {
		t.Errorf("the main listener answered /debug/feeds itself: %s %s", resp.Status, body)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(strings.Join(upstreamPaths, " "), "/debug/feeds") {
		t.Errorf("the main listener's /debug/feeds did not go upstream (%q)", upstreamPaths)
	}
}

// lendingMemapi is a memapi behind a TLS upstream (HTTP/2, as an apiserver), and watchsan in
// lending mode in front of it (front serves its main listener).
type lendingMemapi struct {
	api   *memapi.Server
	up    *httptest.Server
	s     *Server
	front *httptest.Server
}

// newLendingMemapi starts a lendingMemapi whose upstream shows onRequest each request first,
// watchsan with args; the cleanup shuts watchsan's watches and feeds down.
func newLendingMemapi(t *testing.T, onRequest func(*http.Request), args ...string) *lendingMemapi {
	t.Helper()
	api := memapi.New(nil)
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		onRequest(r)
		api.ServeHTTP(w, r)
	}))
	up.EnableHTTP2 = true
	up.StartTLS()
	t.Cleanup(up.Close)
	t.Cleanup(api.Close)
	s, _ := newServerFrom(t, lendingConfig(t, up.URL, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: up.Certificate().Raw}), args...))
	front := httptest.NewServer(s.Handler())
	t.Cleanup(front.Close)
	t.Cleanup(func() { close(s.watchesDone) }) // shutdown: every watch and feed ends
	return &lendingMemapi{api: api, up: up, s: s, front: front}
}

// openConfigmapWatch opens a watch of configmaps in d at front from rv, with more query
// parameters (url-encoded, "" for none) and hdr, and fails the test unless it is answered 200;
// the response's body is closed at the test's end.
func openConfigmapWatch(t *testing.T, front string, rv uint64, more string, hdr http.Header) *http.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/api/v1/namespaces/d/configmaps?watch=true&resourceVersion=%d%s", front, rv, more), nil)
	req.Header = hdr
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("watch: %s %s", resp.Status, b)
	}
	return resp
}

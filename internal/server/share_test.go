package server

import (
	"bufio"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/watchsan/watchsan/internal/testutil"
)

// --share-watches through the whole server in lending mode (the sidecar's): identical watches
// without credentials are one upstream watch, each client gets every event; a client with its
// own token is not shared: it would be only once an access review allowed it, and memapi
// answers none (a 404, access-review-failed). With --share-watches=false, each watch is its own.
func TestShareWatchesLending(t *testing.T) {
	for _, share := range []bool{true, false} {
		t.Run(fmt.Sprintf("share=%v", share), func(t *testing.T) {
			var watches atomic.Int32
			args := []string{fmt.Sprintf("--share-watches=%v", share)}
			x := newLendingMemapi(t, func(r *http.Request) {
				if r.URL.Query().Get("watch") == "true" {
					watches.Add(1)
				}
			}, args...)
			s, up, rv := x.s, x.up, x.api.ResourceVersion()
			open := func(hdr http.Header) *bufio.Scanner {
				sc := bufio.NewScanner(openConfigmapWatch(t, x.front.URL, rv, "", hdr).Body)
				sc.Buffer(nil, 1<<20)
				return sc
			}
			var clients []*bufio.Scanner
			for i := 0; i < 3; i++ {
				clients = append(clients, open(http.Header{}))
			}
			own := open(http.Header{"Authorization": {"Bearer alice"}})
			if share {
				testutil.Eventually(t, 10*time.Second, "3 subscribers", func() bool {
					return promtest.ToFloat64(s.Metrics().SharedSubscribers) == 3
				})
			}
			c := up.Client()
			for i := 0; i < 3; i++ {
				resp, err := c.Post(up.URL+"/api/v1/namespaces/d/configmaps", "application/json",
					strings.NewReader(fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm-%d"}}`, i)))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}
			for i, sc := range append(clients, own) {
				for j := 0; j < 3; j++ {
					if !sc.Scan() {
						t.Fatalf("client %d: stream ended after %d events: %v", i, j, sc.Err())
					}
					if want := fmt.Sprintf(`"name":"cm-%d"`, j); !strings.Contains(sc.Text(), want) {
						t.Fatalf("client %d event %d: %s, want %s", i, j, sc.Text(), want)
					}
				}
			}
			want := int32(4)
			if share {
				want = 2 // one feed, and the client with its own token
			}
			if got := watches.Load(); got != want {
				t.Errorf("%d upstream watches, want %d", got, want)
			}
			if got := promtest.ToFloat64(s.Metrics().PrivateFeeds.WithLabelValues("access-review-failed")); share && got != 1 {
				t.Errorf("private feeds (access-review-failed) %v, want 1: the token's", got)
			}
		})
	}
}

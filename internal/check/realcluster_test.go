package check

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/watchsan/watchsan/internal/faults"
	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/test/cluster"
	"github.com/watchsan/watchsan/test/cluster/clustertest"
)

// quick are the waits the tests use: long enough for the apiserver's pre-deadline bookmark
// (2 s before a 5 s deadline), short enough to run often.
var quick = Options{BookmarkWait: 5 * time.Second, IdleWait: 5 * time.Second, StepTimeout: 20 * time.Second}

// These run the check against a real kube-apiserver, directly and behind the fault layer,
// and hold it to finding each problem the layer injects and nothing else.
func TestCheckRealAPIServer(t *testing.T) {
	c := clustertest.Start(t, cluster.Options{})
	admin := kubernetes.NewForConfigOrDie(c.RESTConfig(0, c.AdminToken))

	t.Run("direct is clean", func(t *testing.T) {
		rep := runCheck(t, c.RESTConfig(0, c.AdminToken), quick)
		if rep.Affected || len(rep.Problems) != 0 {
			t.Fatalf("problems against the real apiserver: %q", rep.Problems)
		}
		d := rep.Delete
		if d.WentBackwards || len(d.Replayed) != 0 || len(d.Events) != quick.withDefaults().Objects+2 {
			t.Errorf("delete: %+v", d)
		}
		if len(rep.Bookmarks.AtSeconds) == 0 || rep.IdleCut.Cut || !rep.IdleCut.Checked {
			t.Errorf("bookmarks %+v, idle %+v", rep.Bookmarks, rep.IdleCut)
		}
		if rep.Version.Affected || !rep.Version.Known || !strings.HasPrefix(rep.Version.GitVersion, "v1.") {
			t.Errorf("version %+v", rep.Version)
		}
		requireGone(t, admin, rep.Namespace)
	})

	t.Run("delete-old-rv: backwards and replay", func(t *testing.T) {
		layer, u := faultFront(t, c, nil)
		set(t, layer, faults.Faults{DeleteOldRV: true})
		rep := runCheck(t, &rest.Config{Host: u}, Options{StepTimeout: 20 * time.Second})
		d := rep.Delete
		if !d.WentBackwards || len(d.Replayed) == 0 || !rep.Affected {
			t.Fatalf("the check missed the regression: %+v, problems %q", d, rep.Problems)
		}
		// a's create, the others' creates and the delete: the replay is everything after a's
		// create that the first watch delivered.
		if n := quick.withDefaults().Objects + 1; len(d.Replayed) != n {
			t.Errorf("replayed %v, want the %d events after a's create", d.Replayed, n)
		}
		if d.DeletedRV != d.Events[0].RV {
			t.Errorf("DELETED rv %s, want a's create rv %s", d.DeletedRV, d.Events[0].RV)
		}
		wantProblems(t, rep, "went back in resourceVersion", "delivered 4 events again")
		if rep.Bookmarks.Checked || rep.IdleCut.Checked {
			t.Errorf("skipped checks ran: %+v %+v", rep.Bookmarks, rep.IdleCut)
		}
		if s := layer.Stats(); s.DeletesRewritten < 2 {
			t.Errorf("layer stats %+v", s)
		}
		requireGone(t, admin, rep.Namespace)
	})

	t.Run("idle cut", func(t *testing.T) {
		layer, u := faultFront(t, c, nil)
		set(t, layer, faults.Faults{EndIdleAfter: 2 * time.Second})
		o := quick
		o.BookmarkWait = 0
		rep := runCheck(t, &rest.Config{Host: u}, o)
		ic := rep.IdleCut
		if !ic.Cut || ic.CutAfterSeconds < 1.9 || ic.CutAfterSeconds > 4 {
			t.Fatalf("idle: %+v, want cut after about 2s", ic)
		}
		wantProblems(t, rep, "ended an idle watch after")
		if len(rep.Problems) != 1 {
			t.Errorf("problems %q, want only the cut", rep.Problems)
		}
	})

	t.Run("bookmarks dropped", func(t *testing.T) {
		layer, u := faultFront(t, c, nil)
		set(t, layer, faults.Faults{DropBookmarks: true})
		o := quick
		o.IdleWait = 0
		rep := runCheck(t, &rest.Config{Host: u}, o)
		if b := rep.Bookmarks; !b.Checked || len(b.AtSeconds) != 0 || b.EndedEarlySeconds != 0 {
			t.Fatalf("bookmarks %+v, want none", b)
		}
		wantProblems(t, rep, "no bookmark within 5s")
		if len(rep.Problems) != 1 || layer.Stats().BookmarksDropped == 0 {
			t.Errorf("problems %q, want only the bookmarks; layer %+v", rep.Problems, layer.Stats())
		}
	})

	t.Run("affected version", func(t *testing.T) {
		_, u := faultFront(t, c, func(w http.ResponseWriter, r *http.Request) bool {
			if r.URL.Path != "/version" {
				return false
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"major":"1","minor":"9","gitVersion":"v1.9.2-gke.1","platform":"linux/amd64"}`)
			return true
		})
		rep := runCheck(t, &rest.Config{Host: u}, Options{StepTimeout: 20 * time.Second})
		if !rep.Version.Affected || rep.Version.GitVersion != "v1.9.2-gke.1" {
			t.Fatalf("version %+v", rep.Version)
		}
		wantProblems(t, rep, "v1.9.2-gke.1 is in the affected range 1.9.0-1.9.2")
	})

	t.Run("interrupted: the namespace is deleted", func(t *testing.T) {
		var progress syncBuffer
		chk := New(newClient(t, c.RESTConfig(0, c.AdminToken)), "direct", clock.RealClock{},
			NewProgress(&progress, false), zaptest.NewLogger(t))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		type result struct {
			rep Report
			err error
		}
		done := make(chan result, 1)
		go func() {
			rep, err := chk.Run(ctx, Options{BookmarkWait: time.Minute, IdleWait: time.Minute})
			done <- result{rep, err}
		}()
		testutil.Eventually(t, 30*time.Second, "the check to wait on its quiet watches", func() bool {
			return strings.Contains(progress.String(), "waiting for bookmarks")
		})
		cancel()
		var res result
		select {
		case res = <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return within 30s of the cancel")
		}
		if res.err == nil || res.rep.Namespace == "" || !res.rep.Cleanup.Deleted {
			t.Fatalf("err %v, report %+v", res.err, res.rep)
		}
		requireGone(t, admin, res.rep.Namespace)
	})
}

func runCheck(t *testing.T, rc *rest.Config, o Options) Report {
	t.Helper()
	chk := New(newClient(t, rc), rc.Host, clock.RealClock{}, nil, zaptest.NewLogger(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := chk.Run(ctx, o)
	var text bytes.Buffer
	rep.WriteText(&text)
	t.Logf("report:\n%s", text.String())
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !rep.Cleanup.Deleted {
		t.Errorf("cleanup %+v", rep.Cleanup)
	}
	return rep
}

func newClient(t *testing.T, rc *rest.Config) rest.Interface {
	t.Helper()
	client, err := NewClient(rc)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	return client
}

func wantProblems(t *testing.T, rep Report, want ...string) {
	t.Helper()
	all := strings.Join(rep.Problems, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("problems lack %q:\n%s", w, all)
		}
	}
	if !rep.Affected {
		t.Error("report not affected")
	}
}

// requireGone fails unless ns is gone or terminating (no namespace controller runs in the
// test cluster, so a deleted namespace stays terminating).
func requireGone(t *testing.T, cs kubernetes.Interface, ns string) {
	t.Helper()
	got, err := cs.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Fatalf("getting namespace %s: %v", ns, err)
	}
	if got.Status.Phase != corev1.NamespaceTerminating || got.DeletionTimestamp == nil {
		t.Fatalf("namespace %s is %s, want it deleted", ns, got.Status.Phase)
	}
}

func set(t *testing.T, l *faults.Layer, f faults.Faults) {
	t.Helper()
	if err := l.Set(f); err != nil {
		t.Fatal(err)
	}
}

// faultFront serves a fault layer in front of apiserver 0 over plain HTTP, through a
// ReverseProxy that authenticates as the admin: a gateway that holds the credentials. answer,
// when not nil, answers a request itself first when it returns true (a stand-in /version).
func faultFront(t *testing.T, c *cluster.Cluster, answer func(http.ResponseWriter, *http.Request) bool) (*faults.Layer, string) {
	t.Helper()
	target, err := url.Parse(c.APIServers[0].URL)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(c.CAData)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}
	token := c.AdminToken
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Header.Set("Authorization", "Bearer "+token)
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorLog:      log.New(io.Discard, "", 0),
	}
	layer := faults.New(rp, zaptest.NewLogger(t))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if answer != nil && answer(w, r) {
			return
		}
		layer.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		srv.Close()
		tr.CloseIdleConnections()
	})
	return layer, srv.URL
}

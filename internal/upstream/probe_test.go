package upstream

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"k8s.io/client-go/rest"

	"github.com/watchsan/watchsan/internal/testutil"
)

// readyzServer is an HTTPS HTTP/2 upstream whose /readyz answers code, and which, like an
// apiserver with UnauthenticatedHTTP2DOSMitigation, closes the connection of every request
// without an Authorization header (Connection: close). It records where requests came from.
type readyzServer struct {
	*httptest.Server
	code   atomic.Int32
	probes atomic.Int32

	mu        sync.Mutex
	probeAuth []string        // the Authorization of each /readyz
	clients   map[string]bool // the remote addresses client requests came from
}

func newReadyzServer(t *testing.T, code int) *readyzServer {
	s := &readyzServer{clients: map[string]bool{}}
	s.code.Store(int32(code))
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "" {
			w.Header().Set("Connection", "close") // k8s.io/apiserver endpoints/filters/authentication.go
		}
		s.mu.Lock()
		if r.URL.Path == "/readyz" {
			s.probeAuth = append(s.probeAuth, r.Header.Get("Authorization"))
		} else {
			s.clients[r.RemoteAddr] = true
		}
		s.mu.Unlock()
		if r.URL.Path == "/readyz" {
			defer s.probes.Add(1)
			w.WriteHeader(int(s.code.Load()))
		}
		io.WriteString(w, "ok")
	}))
	s.EnableHTTP2 = true
	s.StartTLS()
	t.Cleanup(s.Close)
	return s
}

func (s *readyzServer) roots() TransportOptions {
	return TransportOptions{RootCAs: s.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}
}

// runPool runs a pool of one backend at s with quick health checks; states records its
// transitions.
func runPool(t *testing.T, s *readyzServer, to TransportOptions, states *[]State, mu *sync.Mutex) *Pool {
	p := newPool(t, PoolOptions{HealthInterval: 50 * time.Millisecond, ProbeInterval: 50 * time.Millisecond,
		Transport: to, Logger: zaptest.NewLogger(t), OnState: func(_ *Backend, st State) {
			mu.Lock()
			*states = append(*states, st)
			mu.Unlock()
		}}, s.URL)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return p
}

// Anonymous probes, which the apiserver answers with Connection:
// close, go over connections of their own; the client requests' connection stays open.
func TestProbesDoNotCloseTheClientsConnection(t *testing.T) {
	s := newReadyzServer(t, 200)
	var states []State
	var mu sync.Mutex
	p := runPool(t, s, s.roots(), &states, &mu)
	b := p.Backends()[0]
	testutil.Eventually(t, 5*time.Second, "healthy", func() bool { return b.State() == Healthy })
	for s.probes.Load() < 10 {
		req, _ := http.NewRequest(http.MethodGet, b.Target(mustURL(t, "/api/v1/pods")).String(), nil)
		req.Header.Set("Authorization", "Bearer client")
		resp, err := b.Send(req, Decide(req.Header, nil, false, IdentityOff))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		time.Sleep(5 * time.Millisecond)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.clients) != 1 {
		t.Fatalf("client requests came over %d connections while 10 anonymous probes were answered with Connection: close; want 1", len(s.clients))
	}
}

// A /readyz answered 403 to a probe with an identity is no
// readiness: the backend is degraded, never healthy, until /readyz passes.
func TestReadyz403WithAnIdentityIsNotReady(t *testing.T) {
	s := newReadyzServer(t, 403)
	to := s.roots()
	to.ProbeCredentials = &rest.Config{BearerToken: "probe-token"}
	var states []State
	var mu sync.Mutex
	p := runPool(t, s, to, &states, &mu)
	b := p.Backends()[0]
	testutil.Eventually(t, 5*time.Second, "degraded by 403s", func() bool { return b.State() == Degraded && s.probes.Load() >= 5 })
	mu.Lock()
	for _, st := range states {
		if st == Healthy {
			t.Fatalf("a backend whose /readyz answered 403 to the probe identity was healthy (transitions %v)", states)
		}
	}
	mu.Unlock()
	s.mu.Lock()
	if s.probeAuth[0] != "Bearer probe-token" {
		t.Fatalf("the probe went with Authorization %q, want the probe identity's", s.probeAuth[0])
	}
	s.mu.Unlock()
	if b.ReadinessUnverified() {
		t.Fatal("readiness unverified with a probe identity")
	}
	s.code.Store(200)
	testutil.Eventually(t, 5*time.Second, "healthy once /readyz passes", func() bool { return b.State() == Healthy })
}

// Without an identity, a 403 proves only that the backend is alive: taken as ready without
// proof, and said so, while no anonymous probe has passed; once one has (the cluster lets
// anonymous probes read /readyz), a 403 is a restarting apiserver's and means not ready.
func TestReadyz403Anonymous(t *testing.T) {
	s := newReadyzServer(t, 403)
	var states []State
	var mu sync.Mutex
	p := runPool(t, s, s.roots(), &states, &mu)
	b := p.Backends()[0]
	testutil.Eventually(t, 5*time.Second, "healthy without proof", func() bool { return b.State() == Healthy && b.ReadinessUnverified() })
	s.code.Store(200)
	testutil.Eventually(t, 5*time.Second, "verified", func() bool { return !b.ReadinessUnverified() && p.anonPassed.Load() })
	s.code.Store(403)
	testutil.Eventually(t, 5*time.Second, "degraded by a 403 after an anonymous probe passed", func() bool { return b.State() == Degraded })
	if b.ReadinessUnverified() {
		t.Fatal("readiness unverified after an anonymous probe passed")
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// Whose identity a probe carries: the probe identity, else the kubeconfig's when it is lent or
// impersonates, else none.
func TestProbeIdentity(t *testing.T) {
	for _, tc := range []struct {
		name string
		to   func(TransportOptions) TransportOptions
		want string
	}{
		{"none", func(o TransportOptions) TransportOptions { return o }, ""},
		{"lent", func(o TransportOptions) TransportOptions {
			o.Credentials, o.Lend = &rest.Config{BearerToken: "lent"}, true
			return o
		}, "Bearer lent"},
		{"impersonating", func(o TransportOptions) TransportOptions {
			o.Credentials, o.Identity = &rest.Config{BearerToken: "imp"}, IdentityImpersonate
			return o
		}, "Bearer imp"},
		{"not lent", func(o TransportOptions) TransportOptions {
			o.Credentials = &rest.Config{BearerToken: "kept"}
			return o
		}, ""},
		{"probe identity wins", func(o TransportOptions) TransportOptions {
			o.Credentials, o.Lend, o.ProbeCredentials = &rest.Config{BearerToken: "lent"}, true, &rest.Config{BearerToken: "probe"}
			return o
		}, "Bearer probe"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newReadyzServer(t, 200)
			p := newPool(t, PoolOptions{Transport: tc.to(s.roots())}, s.URL)
			if _, err := p.Backends()[0].Probe(context.Background(), time.Second); err != nil {
				t.Fatal(err)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.probeAuth[0] != tc.want {
				t.Fatalf("the probe went with Authorization %q, want %q", s.probeAuth[0], tc.want)
			}
		})
	}
}

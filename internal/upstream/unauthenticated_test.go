package upstream

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
)

// authServer is an HTTPS HTTP/2 upstream that authenticates as an apiserver with
// UnauthenticatedHTTP2DOSMitigation does: "Bearer good" passes, any other token is answered
// 401, no token passes as anonymous; every request it does not authenticate, on HTTP/2, gets
// Connection: close (k8s.io/apiserver endpoints/filters/authentication.go). It records the
// connections each kind of request came over, and their protocol.
type authServer struct {
	*httptest.Server
	mu    sync.Mutex
	conns map[string]map[string]bool // "good" | "refused" | "anonymous" -> remote addresses
	proto map[string]map[int]bool    // the same -> ProtoMajor
}

func newAuthServer(t *testing.T) *authServer {
	s := &authServer{conns: map[string]map[string]bool{}, proto: map[string]map[int]bool{}}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kind, code := "good", http.StatusOK
		switch a := r.Header.Get("Authorization"); a {
		case "Bearer good":
		case "":
			kind = "anonymous"
		default:
			kind, code = "refused", http.StatusUnauthorized
		}
		if kind != "good" && r.ProtoMajor == 2 {
			w.Header().Set("Connection", "close")
		}
		s.mu.Lock()
		if s.conns[kind] == nil {
			s.conns[kind], s.proto[kind] = map[string]bool{}, map[int]bool{}
		}
		s.conns[kind][r.RemoteAddr] = true
		s.proto[kind][r.ProtoMajor] = true
		s.mu.Unlock()
		w.WriteHeader(code)
		io.WriteString(w, "{}")
	}))
	s.EnableHTTP2 = true
	s.StartTLS()
	t.Cleanup(s.Close)
	return s
}

func (s *authServer) seen(kind string) (conns int, protos map[int]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns[kind]), s.proto[kind]
}

// Requests the apiserver will not authenticate, anonymous ones and those with a refused token,
// never go over the HTTP/2 connection authenticated clients share (each would end it with a
// GOAWAY), but for the first 401 of a token. They go over connections of their own.
func TestUnauthenticatedRequestsTravelApart(t *testing.T) {
	s := newAuthServer(t)
	to := TransportOptions{RootCAs: s.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}
	var mu sync.Mutex
	dials := map[string]int{}
	p := newPool(t, PoolOptions{Transport: to, OnDial: func(_ *Backend, conn string, err error) {
		if err == nil {
			mu.Lock()
			dials[conn]++
			mu.Unlock()
		}
	}}, s.URL)
	b := p.Backends()[0]
	send := func(auth string, want int) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, b.Target(mustURL(t, "/api/v1/pods")).String(), nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := b.Send(req, Decide(req.Header, nil, false, IdentityOff))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("%q: %d, want %d", auth, resp.StatusCode, want)
		}
	}
	send("Bearer good", 200)
	for i := 0; i < 20; i++ {
		send("", 200)
		send("Bearer stale", 401)
		send("Bearer good", 200)
	}
	// The stale token's first 401 ends the shared connection (it could not be known before
	// the apiserver said so): two in all, where each of the 40 would have cost one.
	good, goodProto := s.seen("good")
	if good != 2 || !goodProto[2] || goodProto[1] {
		t.Fatalf("authenticated requests came over %d connections (protocols %v) among 40 unauthenticated ones, want 2 HTTP/2 connections", good, goodProto)
	}
	mu.Lock()
	defer mu.Unlock()
	if dials[ConnRequests] != 2 {
		t.Fatalf("the shared connections were dialled %d times, want 2 (dials %v)", dials[ConnRequests], dials)
	}
	if n := dials[ConnUnauthenticated]; n < 39 {
		// 20 anonymous and 19 refused requests on connections of their own, each ended
		// after its request
		t.Fatalf("unauthenticated connections dialled %d times for 39 requests: did they go over the shared ones? (dials %v)", n, dials)
	}
}

// A token answered anything but 401 goes back to the shared connections; the set of refused
// tokens is bounded.
func TestRefusedSet(t *testing.T) {
	var s refusedSet
	s.learn("a", http.StatusUnauthorized)
	if !s.has("a") {
		t.Fatal("a 401 not learned")
	}
	s.learn("a", http.StatusForbidden) // authenticated, not authorized: no GOAWAY
	if s.has("a") {
		t.Fatal("a token the apiserver authenticated stayed refused")
	}
	for i := 0; i < 2*maxRefusedPrincipals; i++ {
		s.learn(strconv.Itoa(i), http.StatusUnauthorized)
	}
	if n := s.len(); n != maxRefusedPrincipals {
		t.Fatalf("%d refused tokens remembered, want the bound %d", n, maxRefusedPrincipals)
	}
}

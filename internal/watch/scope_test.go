package watch

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"
	"k8s.io/client-go/rest"

	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/metrics"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/upstream"
)

// the delete memory is scoped by who the upstream takes a watch for, not by
// its Authorization header. alice and bob, each with a verified client certificate (no
// Authorization: watchsan asserts their identities), watch the same configmaps. alice's watch
// has a regressed DELETED rewritten (to 12), which is remembered for her; her re-watch from 12
// gets the delete replayed and it is dropped, as she has it. bob, watching from 12, has never
// seen that delete: he must get it. With the Authorization header as the scope both had one
// scope (neither sends one), and bob never saw the DELETED.
func TestDeleteMemoryScopedByIdentity(t *testing.T) {
	replay := events(obj("DELETED", "a", "10"), obj("ADDED", "c", "14")) // a watch from 12, on the 1.7 bug
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){
		events(obj("ADDED", "a", "10"), obj("ADDED", "b", "11"), obj("DELETED", "a", "10")), // alice, from 5
		replay, // bob, from 12
		replay, // alice again, from 12
	}}
	upSrv := httptest.NewServer(up)
	defer upSrv.Close()
	u, _ := url.Parse(upSrv.URL)
	log := zaptest.NewLogger(t)
	pool, err := upstream.NewPool([]*url.URL{u}, upstream.PoolOptions{Logger: log, Transport: upstream.TransportOptions{
		Credentials: &rest.Config{BearerToken: "watchsan"}, Lend: true, Identity: upstream.IdentityImpersonate}})
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New(nil)
	h, err := New(Config{DisableResume: true}, Deps{Attempts: upstream.NewAttempter(pool, upstream.AttempterOptions{}), Metrics: m,
		Memory: fix.NewDeleteMemory(0, 0, nil), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	waitServed(t, h)
	// The server's decision for a client with a verified certificate named by X-Test-User.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		leaf := &x509.Certificate{Subject: pkix.Name{CommonName: r.Header.Get("X-Test-User")}}
		cred := upstream.Decide(r.Header, &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{leaf}}}, true, upstream.IdentityImpersonate)
		if _, ok := cred.Asserted(); !ok {
			t.Errorf("decided %s, want asserted", cred)
		}
		info := reqinfo.Parse(r)
		h.Serve(w, r, &info, &cred, "")
	}))
	defer srv.Close()
	watchAs := func(user, rv string) ([]got, error) {
		t.Helper()
		f := &fixture{srv: srv}
		return f.watchWith(t, "resourceVersion="+rv, http.Header{"X-Test-User": {user}})
	}
	gs, err := watchAs("alice", "5")
	expectStream(t, gs, err, "ADDED a 10, ADDED b 11, DELETED a 12")
	gs, err = watchAs("bob", "12")
	expectStream(t, gs, err, "DELETED a 13, ADDED c 14")
	gs, err = watchAs("alice", "12")
	expectStream(t, gs, err, "ADDED c 14")
	if q := up.query(1); q.Get("resourceVersion") != "12" {
		t.Fatalf("bob's watch went upstream from %q, want 12", q.Get("resourceVersion"))
	}
}

// The scope names the principal, never a credential; watches of one selection by one principal
// share it, and the lent identity, the anonymous user, a certificate and a token each have
// their own.
func TestScopeOfNamesThePrincipal(t *testing.T) {
	r := httptest.NewRequest("GET", "/api/v1/namespaces/d/configmaps?watch=1&labelSelector=x%3Dy", nil)
	cert := func(cn string) *tls.ConnectionState {
		return &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{{Subject: pkix.Name{CommonName: cn}}}}}
	}
	tok := http.Header{"Authorization": {"Bearer secret-token"}}
	scopes := map[string]string{
		"lent":      scopeOf(parseParams(r).scope, upstream.Decide(http.Header{}, nil, true, upstream.IdentityOff)),
		"anonymous": scopeOf(parseParams(r).scope, upstream.Decide(http.Header{}, nil, false, upstream.IdentityOff)),
		"alice":     scopeOf(parseParams(r).scope, upstream.Decide(http.Header{}, cert("alice"), true, upstream.IdentityImpersonate)),
		"bob":       scopeOf(parseParams(r).scope, upstream.Decide(http.Header{}, cert("bob"), true, upstream.IdentityImpersonate)),
		"token":     scopeOf(parseParams(r).scope, upstream.Decide(tok, cert("alice"), true, upstream.IdentityImpersonate)),
	}
	seen := map[string]string{}
	for who, s := range scopes {
		if other, ok := seen[s]; ok {
			t.Errorf("%s and %s share the scope %q", who, other, s)
		}
		seen[s] = who
		if want := "/api/v1/namespaces/d/configmaps?l=x=y&f=&u="; len(s) <= len(want) || s[:len(want)] != want {
			t.Errorf("%s: scope %q, want it to start with %q", who, s, want)
		}
	}
	if s := scopes["token"]; strings.Contains(s, "secret-token") {
		t.Errorf("the scope %q holds the token", s)
	}
	if a := scopeOf(parseParams(r).scope, upstream.Decide(http.Header{}, cert("alice"), true, upstream.IdentityImpersonate)); a != scopes["alice"] {
		t.Errorf("alice's two watches have scopes %q and %q", a, scopes["alice"])
	}
}

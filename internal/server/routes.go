package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/gorilla/mux"

	"github.com/watchsan/watchsan/internal/apistatus"
	"github.com/watchsan/watchsan/internal/coalesce"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/upstream"
)

// Handler is the main listener's handler. Each request is classified once (reqinfo), its
// credentials decided once (upstream.Decide, on the request as the client sent it), checked
// once by the guard and given a request id; then the first route of the table (routes) that
// matches serves it, given that decision as a value, logged and counted like every request
// (serveInstrumented).
func (s *Server) Handler() http.Handler {
	table := s.routes()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// What is decided before routing is a function of its own, returned before the route
		// runs: a watch parks its goroutine for its whole life, and this frame with it
		// (watch.Handler.Serve).
		r, c, next := s.classify(w, r, table)
		defer c.releaseHeaders()
		if c.ref == nil && c.info.Verb == "list" {
			next = s.teeList(next)
		}
		s.serveInstrumented(w, r, c, next)
	})
}

// classify decides about r what Handler says, and picks its route from table.
func (s *Server) classify(w http.ResponseWriter, r *http.Request, table *mux.Router) (*http.Request, *classified, route) {
	headersDone(r) // the per-source limit of connections sending headers (sources.go)
	c := &classified{info: reqinfo.Parse(r), cred: upstream.Decide(r.Header, r.TLS, s.cfg.Lend, s.cfg.Identity), id: requestID(r)}
	c.ref = s.guard.refuse(r, c.cred)
	if s.coalesce != nil && c.ref == nil && !c.info.IsWatch() {
		c.coalesceKey, c.coalesceKind, c.coalescable = coalesce.Classify(r, &c.info, c.cred)
	}
	if rc := rebalanceOf(r); rc.isShed() {
		// The connection was shed (rebalance.go): closed after this answer (HTTP/2: a GOAWAY),
		// and a watch, which would hold it, refused with the 429 its client retries.
		w.Header().Set("Connection", "close")
		if c.ref == nil && c.info.IsWatch() {
			c.ref = rebalanceRefusal(s.shedder.Limit())
		}
	}
	if c.ref == nil {
		c.releaseHeaders, c.ref = s.headers.admit(r, c.cred.Anonymous())
	}
	if c.releaseHeaders == nil {
		c.releaseHeaders = func() {}
	}
	if c.ref != nil {
		s.metrics.Refused.WithLabelValues(c.ref.reason).Inc()
	}
	w.Header()["X-Request-Id"] = []string{c.id} // a client can quote it; the logs carry it
	// mux's matchers see only the request, so the classification rides in the context of a
	// copy of it for them: set here, once, read by the matchers only. The route is handed the
	// request as it came and the classification as a value, so that the copy is garbage at
	// once instead of held for a watch's life (about 370 bytes per idle watch).
	var m mux.RouteMatch
	table.Match(r.WithContext(context.WithValue(r.Context(), classifiedKey{}, c)), &m) // the last route matches every request
	c.route = m.Route.GetName()
	return r, c, m.Handler.(route)
}

// teeList is next with the list it answers read as it is written to the client, to be kept as
// the state at the list's resourceVersion for the client's watch from there (watch.TeeList,
// docs/design.md section 12, "a client's own list"), whichever route answers it (the coalescer,
// the time-travel guard's, the pass-through).
//
// A route that returns wrote the answer it had: one cut short panics (http.ErrAbortHandler),
// and a body that stops early anyway never decodes as a shorter list
// (stream.TestListCutShortNeverDecodesShorter). Whether the client stayed to read it is not
// asked: a client that reads a list whole and closes its connection at once (Go's client does
// when its decoder leaves the last newline unread) cancels the request's context while the
// route returns, which once lost the state of a list-then-watch client's watch now and then.
func (s *Server) teeList(next route) route {
	return func(w http.ResponseWriter, r *http.Request, c *classified) {
		tw, done := s.watch.TeeList(w, r, &c.info, c.cred)
		returned := false
		defer func() { done(returned) }()
		next(tw, r, c)
		returned = true
	}
}

// route serves a request the main listener classified as c.
type route func(w http.ResponseWriter, r *http.Request, c *classified)

// ServeHTTP serves r as classifiedOf(r) (a test calling a route directly).
func (rt route) ServeHTTP(w http.ResponseWriter, r *http.Request) { rt(w, r, classifiedOf(r)) }

// routes is the main listener's route table, tried in order; the first match serves. There
// are no local endpoints: /healthz, /readyz, /livez and /metrics are the apiserver's and pass
// through (watchsan's own are on the admin listener).
//
//	route         matches                                 policy
//	refused       what the guard refuses (guard.go)       answered with its Status, counted; never sent upstream
//	watch         a watch, as reqinfo classifies it        the watch pipeline: parsed, sanitized, resumed (internal/watch)
//	coalesce      an identical read of one principal:     served from one upstream read begun after it arrived,
//	              a list at RV "" or 0, discovery, OpenAPI shared with the identical reads arriving before it begins (coalesce.go)
//	list          a GET list (time-travel guard on)        at resourceVersion=0: sent at the high-water mark (listGuard, ha.go)
//	pass-through  everything else: verbs, discovery,      streamed as it is, upgrades (exec, attach, port-forward)
//	              OpenAPI, upgrades                        spliced; retried before the response starts (upstream.Attempter)
//
// Every route that goes upstream sends with the credentials Handler decided (classified.cred).
// The router is used only to match (the Handler calls Match): mux neither cleans the path
// (the guard must see dot segments as sent) nor copies the request to store its variables.
func (s *Server) routes() *mux.Router {
	t := mux.NewRouter()
	t.SkipClean(true)
	t.MatcherFunc(func(r *http.Request, _ *mux.RouteMatch) bool { return classifiedOf(r).ref != nil }).
		Name("refused").Handler(route(serveRefusal))
	t.MatcherFunc(func(r *http.Request, _ *mux.RouteMatch) bool { return classifiedOf(r).info.IsWatch() }).
		Name("watch").Handler(route(func(w http.ResponseWriter, r *http.Request, c *classified) {
		s.watch.Serve(w, r, &c.info, &c.cred, c.id)
	}))
	t.MatcherFunc(func(r *http.Request, _ *mux.RouteMatch) bool { return classifiedOf(r).coalescable }).
		Name("coalesce").Handler(route(s.serveCoalesced))
	t.MatcherFunc(func(r *http.Request, _ *mux.RouteMatch) bool {
		return s.cfg.TimeTravelGuard && r.Method == http.MethodGet && classifiedOf(r).info.Verb == "list"
	}).Name("list").Handler(route(s.listGuard))
	t.MatcherFunc(func(*http.Request, *mux.RouteMatch) bool { return true }).Name("pass-through").
		Handler(route(func(w http.ResponseWriter, r *http.Request, c *classified) {
			s.proxy.serve(w, r, c, upstream.Plan{Credentials: c.cred})
		}))
	return t
}

func serveRefusal(w http.ResponseWriter, _ *http.Request, c *classified) {
	apistatus.Write(w, c.ref.status)
}

// classified is what the main listener decided about one request before routing it.
type classified struct {
	info reqinfo.Info
	// cred is whose credentials it goes upstream with, decided on the request as it came.
	cred  upstream.Credentials
	ref   *refusal // nil: not refused
	id    string   // the request id (requestID)
	route string   // the route that served it, for the access log
	// coalescable: a read that may share an upstream read (coalesce.Classify), under
	// coalesceKey, of coalesceKind; false (the zero value): it goes alone.
	coalescable  bool
	coalesceKey  coalesce.Key
	coalesceKind string
	// releaseHeaders gives its header bytes back to the budgets (headers.go) when it is done;
	// never nil once classified.
	releaseHeaders func()
}

type classifiedKey struct{}

// classifiedOf returns what Handler decided about r; every request on the main listener has it.
func classifiedOf(r *http.Request) *classified {
	c, _ := r.Context().Value(classifiedKey{}).(*classified)
	if c == nil {
		return &classified{info: reqinfo.Parse(r), cred: upstream.Decide(r.Header, r.TLS, false, upstream.IdentityOff)} // not through Handler (a test calling a route directly)
	}
	return c
}

// requestID is the client's X-Request-Id when it looks like an id (1 to 64 letters, digits and
// ._:-), so that a caller's own id ties its logs to watchsan's; otherwise a new one.
func requestID(r *http.Request) string {
	if v := r.Header["X-Request-Id"]; len(v) == 1 && plausibleID(v[0]) {
		return v[0]
	}
	return newRequestID()
}

func plausibleID(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}

// Request ids are this process's random prefix and a counter: unique across restarts and
// replicas in practice, one small allocation each, no UUID generation per request.
var (
	idPrefix = func() string {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		return hex.EncodeToString(b)
	}()
	idSeq atomic.Uint64
)

func newRequestID() string {
	var b [32]byte
	n := copy(b[:], idPrefix)
	b[n] = '-'
	return string(strconv.AppendUint(b[:n+1], idSeq.Add(1), 36))
}

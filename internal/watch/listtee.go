package watch

import (
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/watchsan/watchsan/internal/absorb"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/upstream"
)

// A client's own list as the state at its resourceVersion (docs/design.md section 12, "a
// client's own list"): a client that lists and then watches from the list's resourceVersion
// L holds exactly that list, so the list, read as it is sent to the client (never held back
// from it), is parked as the state complete at L under the key its watch from L looks up
// (stateKey: the same path, parameters, Accept and principal). The watch adopts it as a
// re-watch adopts an ended watch's (openState, sharedState), and absorbs a 410 with it.

// TeeList is the ResponseWriter a list request r (classified as info, sent with cred) is
// answered through, and done, which the caller calls with true when the route returned (false:
// it panicked, as a response cut short does); a body that ended early is refused when it is
// read, since no list cut short decodes. For a request that does not
// qualify it returns w itself and a done that does nothing. Qualifying: a GET list, absorbing
// on, resourceVersion unset or "0" (a list at "0" with resourceVersionMatch NotOlderThan or
// none), whole objects or Table rows (wholeOrTable); a later page (a continue token) only when
// its list's pages before were read (clientPages).
func (h *Handler) TeeList(w http.ResponseWriter, r *http.Request, info *reqinfo.Info, cred upstream.Credentials) (http.ResponseWriter, func(bool)) {
	q := r.URL.Query() // the list's, parsed once here
	if !h.teesList(r, q, info) {
		return w, func(bool) {}
	}
	if cred.Principal() == "" {
		cred = upstream.Decide(r.Header, r.TLS, false, upstream.IdentityOff) // as open decides a watch's
	}
	t := &listTee{ResponseWriter: w, h: h, r: r, cred: cred, key: stateKey(r, q, cred)}
	if cont := q.Get("continue"); cont != "" {
		// A later page: read only onto the pages of its list read before.
		if t.prev = h.clientPages.take(t.key, cont); t.prev == nil {
			return w, func(bool) {}
		}
	} else if h.clientLists.inFlight(t.key) != nil {
		// The same principal's list of the same scope is being read already: one copy at a
		// time. In a relist storm, identical lists are coalesced (docs/design.md section 18) and
		// answer at one resourceVersion, whose one parked state serves their feed; decoding each
		// member's copy would cost watchsan a list's decoding per client (about 25 ns a byte).
		// A list left uncopied is as before this: its watch absorbs a 410 only through a feed
		// that holds a state. Not counted in AbsorbClientLists.
		return w, func(bool) {}
	}
	t.release = h.clientLists.begin(t.key)
	return t, t.done
}

// clientPages are the clients' lists read so far, a page at a time, each waiting for its next
// page (a client's request with the continue token its last page gave), by stateKey and that
// token, for the park time at most. What they hold stays counted in the states' budget. mu
// guards m; the zero value is empty.
type clientPages struct {
	mu sync.Mutex
	m  map[string]*pagesRead
}

type pagesRead struct {
	l     *absorb.Listed
	timer clock.Timer
}

// put keeps l for the request of its next page, continue token cont, for ttl on clk; then
// frees it.
func (c *clientPages) put(clk clock.WithDelayedExecution, ttl time.Duration, key, cont string, l *absorb.Listed) {
	k := key + "\x00continue=" + cont
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*pagesRead{}
	}
	if old := c.m[k]; old != nil {
		old.timer.Stop()
		old.l.Free()
	}
	pr := &pagesRead{l: l}
	pr.timer = clk.AfterFunc(ttl, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.m[k] == pr {
			delete(c.m, k)
			pr.l.Free()
		}
	})
	c.m[k] = pr
}

// take is the list read so far whose next page's request is key's with the continue token
// cont, nil when none is kept.
func (c *clientPages) take(key, cont string) *absorb.Listed {
	k := key + "\x00continue=" + cont
	c.mu.Lock()
	defer c.mu.Unlock()
	pr := c.m[k]
	if pr == nil {
		return nil
	}
	delete(c.m, k)
	pr.timer.Stop()
	return pr.l
}

// clientLists are the clients' lists being read (TeeList), by stateKey. A client's watch from
// its list's resourceVersion may arrive before the list is parked: the client has the list's
// last byte (a JSON decoder stops at the closing brace) before the handler returns and
// TeeList's done parks it. So a watch from a resourceVersion waits for the lists of its key
// in flight (awaitClientList), at most clientListWait. mu guards m; the zero value is empty.
type clientLists struct {
	mu sync.Mutex
	m  map[string]*listsInFlight
}

// listsInFlight are the lists of one key being read: n of them, done closed when the last ends.
type listsInFlight struct {
	n    int
	done chan struct{}
}

// clientListWait bounds how long a watch waits for its client's list to be parked: the list
// is whole by then (its client has it), and only its decoding is left.
const clientListWait = 2 * time.Second

// begin counts a list of key in flight; the func it returns ends it, once.
func (c *clientLists) begin(key string) func() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*listsInFlight{}
	}
	l := c.m[key]
	if l == nil {
		l = &listsInFlight{done: make(chan struct{})}
		c.m[key] = l
	}
	l.n++
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if l.n--; l.n == 0 {
				delete(c.m, key)
				close(l.done)
			}
		})
	}
}

// inFlight is the channel closed when the lists of key in flight end, nil when there are none.
func (c *clientLists) inFlight(key string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.m[key]; l != nil {
		return l.done
	}
	return nil
}

// awaitClientList waits, at most clientListWait and while r's client is there, for the lists
// of r's key being read (clientLists) when r is a watch from a resourceVersion that may have
// come from one, so that the state parked for it is there when it looks.
func (h *Handler) awaitClientList(r *http.Request, p params, cred upstream.Credentials) {
	if h.cfg.DisableAbsorb || p.rv == "0" || !p.rvIsInt {
		return // a watch from "0" begins with the initial state and needs no list's
	}
	if cred.Principal() == "" {
		cred = upstream.Decide(r.Header, r.TLS, false, upstream.IdentityOff) // as open decides it
	}
	done := h.clientLists.inFlight(stateKey(r, p.query, cred))
	if done == nil {
		return
	}
	t := h.clk.NewTimer(clientListWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C():
	case <-r.Context().Done():
	}
}

// teesList says whether the list r (its query q) is read as the state at its resourceVersion
// (TeeList).
func (h *Handler) teesList(r *http.Request, q url.Values, info *reqinfo.Info) bool {
	if h.cfg.DisableAbsorb || r.Method != http.MethodGet || info.Verb != "list" || !wholeOrTable(r.Header.Get("Accept")) {
		return false
	}
	switch rv, m := q.Get("resourceVersion"), q.Get("resourceVersionMatch"); {
	case rv == "" && m == "":
		return true // a consistent read: etcd's current revision
	case rv == "0" && (m == "" || m == "NotOlderThan"):
		return true // any resourceVersion: the watch cache's snapshot at its own
	}
	return false
}

// listTee is a list's ResponseWriter that copies its body into an absorb.Teed once its header
// says it is a list in a format absorbing reads. Its fields are the request's handler's.
type listTee struct {
	http.ResponseWriter
	h    *Handler
	r    *http.Request
	cred upstream.Credentials
	key  string // stateKey(r, cred): what it is parked by
	// prev is the list's pages read before this one (clientPages); nil: this is its first.
	prev *absorb.Listed
	// release ends the list's count in h.clientLists (done calls it, after parking).
	release func()
	// teed is the copy; nil until the header is written, and then when the answer is not a
	// whole list in a format with a list codec.
	teed *absorb.Teed
	// header: the header was written.
	header bool
}

func (t *listTee) WriteHeader(code int) {
	if !t.header && code >= 200 {
		t.header = true
		h := t.ResponseWriter.Header()
		format, ok := stream.FormatOf(h.Get("Content-Type"))
		ce := h.Get("Content-Encoding")
		if codec := stream.ListCodecForAccept(format, t.r.Header.Get("Accept")); code == http.StatusOK && ok && (identity(h) || ce == "gzip") && codec != nil {
			t.teed = absorb.NewTeed(t.h.stateBudget, format, codec, ce == "gzip")
		}
	}
	t.ResponseWriter.WriteHeader(code)
}

func (t *listTee) Write(p []byte) (int, error) {
	if !t.header {
		t.WriteHeader(http.StatusOK)
	}
	n, err := t.ResponseWriter.Write(p)
	if t.teed != nil {
		if err != nil {
			t.teed.Abandon(absorb.ClientListUnread) // the client did not get the whole list
		} else {
			t.teed.Write(p[:n])
		}
	}
	return n, err
}

// Unwrap lets http.ResponseController reach the connection's writer (flushes, deadlines).
func (t *listTee) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// Flush passes a flush on (httputil.ReverseProxy flushes through ResponseController).
func (t *listTee) Flush() { _ = http.NewResponseController(t.ResponseWriter).Flush() }

// done parks the list read as the state at its resourceVersion, when complete is true and it
// is one; else gives back what it held.
func (t *listTee) done(complete bool) {
	defer t.release()
	m := t.h.deps.Metrics.AbsorbClientLists
	if t.teed == nil {
		if t.prev != nil {
			t.prev.Free()
		}
		if t.header {
			m.WithLabelValues(absorb.ClientListUnread).Inc()
		}
		return
	}
	if !complete {
		t.teed.Abandon(absorb.ClientListUnread)
	}
	l, cont, why, err := t.teed.Page(t.prev)
	if l != nil && cont != "" {
		t.h.clientPages.put(t.h.clk, t.h.cfg.AbsorbParkTime, t.key, cont, l) // for the next page's request
		return
	}
	var s *absorb.State
	rv := ""
	if l != nil {
		s, rv, why = l.State(t.teed.Format())
	}
	if s == nil {
		m.WithLabelValues(why).Inc()
		t.h.log.Debug("a client's list is not kept as the state at its resourceVersion",
			zap.String("path", t.r.URL.Path), zap.String("why", why), zap.Error(err))
		return
	}
	result := absorb.ClientListParked
	if !t.h.parked.Park(t.key, rv, s) {
		result = absorb.ClientListOverBudget
	}
	m.WithLabelValues(result).Inc()
}

// wholeOrTable says whether a request with accept is answered whole objects (no "as=") or
// Table rows (stream.TableAccept), which absorbing reads; not metadata only
// (as=PartialObjectMetadata), whose list and watch a client asks with different Accepts.
func wholeOrTable(accept string) bool {
	return !strings.Contains(accept, "as=") || stream.TableAccept(accept)
}

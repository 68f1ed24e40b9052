package faults

import (
	"bytes"
	"net/http"
	"sync"

	"github.com/watchsan/watchsan/internal/reqinfo"
)

// Gate holds what waits on it until it is opened. The zero value is not usable: NewGate.
type Gate struct {
	ch   chan struct{}
	once sync.Once
}

// NewGate returns a closed gate.
func NewGate() *Gate { return &Gate{ch: make(chan struct{})} }

// Open lets everything through, now and from now on; calling it again does nothing.
func (g *Gate) Open() { g.once.Do(func() { close(g.ch) }) }

// holdList serves the list r through next with its answer held, as HoldListAnswers says: the
// apiserver answers at once (its read happens now), the answer reaches the client once hold is
// open or the client left. It reports false, having done nothing, when r is no list.
func (l *Layer) holdList(w http.ResponseWriter, r *http.Request, hold *Gate) bool {
	if r.Method != http.MethodGet || reqinfo.Parse(r).Verb != "list" {
		return false
	}
	rec := &heldResponse{header: http.Header{}}
	l.next.ServeHTTP(rec, r)
	l.stats.listsHeld.Add(1)
	select {
	case <-hold.ch:
	case <-r.Context().Done():
		return true
	}
	copyHeader(w.Header(), rec.header)
	if rec.code == 0 {
		rec.code = http.StatusOK
	}
	w.WriteHeader(rec.code)
	_, _ = w.Write(rec.body.Bytes())
	return true
}

// heldResponse keeps a response whole (a test's list, small).
type heldResponse struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (h *heldResponse) Header() http.Header { return h.header }
func (h *heldResponse) WriteHeader(code int) {
	if h.code == 0 {
		h.code = code
	}
}
func (h *heldResponse) Write(p []byte) (int, error) {
	if h.code == 0 {
		h.code = http.StatusOK
	}
	return h.body.Write(p)
}

package server

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// headerBudget bounds the header bytes the main listener's requests in progress carry, per
// connection and per source (docs/design.md section 14): each request's header list, already
// bounded by --max-request-header-bytes, is charged when its handler starts and given back
// when it returns (a watch is in progress for its whole life). A request that would pass a
// budget is refused with 429 and Retry-After, before anything goes upstream; one that carries
// no credentials (neither its own nor lent nor a verified certificate) gets half of each
// budget, so that anonymous requests are the first to go.
//
// A shared feed's subscriber on HTTP/1.1 that detaches from its handler (internal/watch,
// detach.go) gives its bytes back then; its connection is one request's.
type headerBudget struct {
	// perConn and perSource are the budgets, bytes; 0: none.
	perConn, perSource int64

	mu sync.Mutex
	// sources holds what each source's requests in progress carry; a source is there while
	// it has some.
	sources map[string]int64
}

func newHeaderBudget(perConn, perSource int) *headerBudget {
	return &headerBudget{perConn: int64(perConn), perSource: int64(perSource), sources: map[string]int64{}}
}

// connHeaders is what one connection's requests in progress carry, guarded by the budget's
// mutex.
type connHeaders struct{ bytes int64 }

type connHeadersKey struct{}

// admit charges r's header list to its connection and its source. It returns the function
// that gives it back, or the refusal when a budget would be passed.
func (b *headerBudget) admit(r *http.Request, anonymous bool) (release func(), ref *refusal) {
	if b.perConn <= 0 && b.perSource <= 0 {
		return func() {}, nil
	}
	n := headerListSize(r)
	conn, _ := r.Context().Value(connHeadersKey{}).(*connHeaders)
	if b.perConn <= 0 {
		conn = nil
	}
	key := ""
	if b.perSource > 0 {
		key = sourceKeyOf(r.RemoteAddr)
	}
	limit := func(budget int64) int64 {
		if anonymous {
			return budget / 2
		}
		return budget
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case conn != nil && conn.bytes+n > limit(b.perConn):
		return nil, b.refusal("header_bytes_connection", "on its connection", "--max-header-bytes-per-connection", conn.bytes, n, anonymous)
	case key != "" && b.sources[key]+n > limit(b.perSource):
		return nil, b.refusal("header_bytes_source", "from its address", "--max-header-bytes-per-source", b.sources[key], n, anonymous)
	}
	if conn != nil {
		conn.bytes += n
	}
	if key != "" {
		b.sources[key] += n
	}
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if conn != nil {
			conn.bytes -= n
		}
		if key != "" {
			if b.sources[key] -= n; b.sources[key] <= 0 {
				delete(b.sources, key)
			}
		}
	}, nil
}

func (b *headerBudget) refusal(reason, where, flag string, held, n int64, anonymous bool) *refusal {
	half := ""
	if anonymous {
		half = " (half of it for a request without credentials)"
	}
	ref := refused(reason, http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests,
		fmt.Sprintf("watchsan: the requests in progress %s carry %d bytes of headers, and this one %d more: over %s%s; try again once some have finished", where, held, n, flag, half))
	ref.status.Details = &metav1.StatusDetails{RetryAfterSeconds: 1}
	return ref
}

// headerListSize is r's header list as HTTP/2 counts it (RFC 9113 section 6.5.2: each
// field's name and value plus 32), its pseudo-header fields included; an HTTP/1 request is
// counted the same way.
func headerListSize(r *http.Request) int64 {
	n := int64(len(r.Method) + len(r.RequestURI) + len(r.Host) + len("https") + len(":method:path:authority:scheme") + 4*32)
	for k, vs := range r.Header {
		for _, v := range vs {
			n += int64(len(k) + len(v) + 32)
		}
	}
	return n
}

// connContext puts a connection's header account in its requests' contexts, and its
// sourceConn when the per-source limits are on (http.Server.ConnContext, the one way
// net/http ties a request to its connection).
func (s *Server) connContext(ctx context.Context, c net.Conn) context.Context {
	ctx = context.WithValue(ctx, connHeadersKey{}, &connHeaders{})
	if cc := countedOf(c); cc != nil {
		ctx = context.WithValue(ctx, countedConnKey{}, cc)
	}
	if s.sources != nil {
		ctx = sourceConnContext(ctx, c)
	}
	return ctx
}

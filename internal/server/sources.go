package server

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
)

// sourceLimiter bounds what one source may hold of the main listener (frontend
// mode), so that one client cannot lock the others out, as 1,000 connections sending their
// headers slowly did by filling --max-connections for the 30 s header timeout:
//   - at most maxConns connections at once: one more is closed as soon as it is accepted;
//   - at most maxHeaders of them still sending a request's headers (from the accept, or from
//     the first byte of a later request on the connection, to the request's handler): when
//     one more starts, the source's oldest such connection is closed. A slow sender is the
//     oldest soon; a client that sends its headers at once is never it.
//
// A source is an IPv4 address, or an IPv6 /64 (what one host is usually given). Zero for a
// limit: none. Connections beyond --max-connections are answered 429 before any of this (the
// accept that takes them is the global limit's: listeners.go).
type sourceLimiter struct {
	net.Listener
	maxConns, maxHeaders int
	// shed is told each connection closed by a limit, with its reason (metrics.ShedReasons).
	shed func(reason string)

	mu      sync.Mutex
	sources map[string]*source
}

// source is what one source holds.
type source struct {
	conns int
	// sending are its connections still sending a request's headers, oldest first; at most
	// maxHeaders long, so the linear removal costs nothing.
	sending []*sourceConn
}

func newSourceLimiter(ln net.Listener, maxConns, maxHeaders int, shed func(string)) *sourceLimiter {
	return &sourceLimiter{Listener: ln, maxConns: maxConns, maxHeaders: maxHeaders, shed: shed, sources: map[string]*source{}}
}

func (l *sourceLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key := sourceKey(c.RemoteAddr())
		l.mu.Lock()
		s := l.sources[key]
		if s == nil {
			s = &source{}
			l.sources[key] = s
		}
		if l.maxConns > 0 && s.conns >= l.maxConns {
			l.mu.Unlock()
			l.shed("source_connections") // counted before the client can see the close
			c.Close()
			continue
		}
		s.conns++
		sc := &sourceConn{Conn: c, l: l, src: s, key: key}
		evict := l.sendingLocked(sc)
		l.mu.Unlock()
		l.close(evict)
		return sc, nil
	}
}

// sendingLocked records that sc is sending a request's headers and returns the connection of
// its source to close for it, if any.
func (l *sourceLimiter) sendingLocked(sc *sourceConn) *sourceConn {
	if l.maxHeaders <= 0 || sc.sending || sc.closed {
		return nil
	}
	sc.sending = true
	s := sc.src
	s.sending = append(s.sending, sc)
	if len(s.sending) <= l.maxHeaders {
		return nil
	}
	oldest := s.sending[0]
	s.sending = slices.Delete(s.sending, 0, 1)
	oldest.sending = false
	return oldest
}

// doneLocked records that sc is no longer sending headers.
func (l *sourceLimiter) doneLocked(sc *sourceConn) {
	if !sc.sending {
		return
	}
	sc.sending = false
	if i := slices.Index(sc.src.sending, sc); i >= 0 {
		sc.src.sending = slices.Delete(sc.src.sending, i, i+1)
	}
}

func (l *sourceLimiter) close(sc *sourceConn) {
	if sc != nil {
		l.shed("source_headers") // counted before the client can see the close
		sc.Close()
	}
}

// connState follows the main server's connections (http.Server.ConnState). An HTTP/1
// connection that goes idle between requests is watched for the next request's first byte
// (sourceConn.Read): from then it is sending headers again. (The server's own StateActive
// comes only once the headers are in. An HTTP/2 connection's requests arrive each in one
// HEADERS frame, and an idle one still gets PINGs: it is not watched.)
func (l *sourceLimiter) connState(c net.Conn, st http.ConnState) {
	sc := sourceConnOf(c)
	if sc == nil {
		return
	}
	switch st {
	case http.StateIdle:
		if tc, ok := c.(*tls.Conn); !ok || tc.ConnectionState().NegotiatedProtocol != "h2" {
			sc.idle.Store(true)
		}
	case http.StateHijacked, http.StateClosed:
		sc.idle.Store(false)
		l.mu.Lock()
		l.doneLocked(sc)
		l.mu.Unlock()
	}
}

// sourceConnContext puts a connection's sourceConn in its requests' contexts
// (Server.connContext), for headersDone.
func sourceConnContext(ctx context.Context, c net.Conn) context.Context {
	if sc := sourceConnOf(c); sc != nil {
		return context.WithValue(ctx, sourceConnKey{}, sc)
	}
	return ctx
}

type sourceConnKey struct{}

// headersDone tells the limiter that r's headers have arrived: its handler runs.
func headersDone(r *http.Request) {
	if sc, ok := r.Context().Value(sourceConnKey{}).(*sourceConn); ok {
		sc.l.mu.Lock()
		sc.l.doneLocked(sc)
		sc.l.mu.Unlock()
	}
}

// sourceConn is a connection a sourceLimiter accepted; its fields are guarded by the
// limiter's mutex.
type sourceConn struct {
	net.Conn
	l       *sourceLimiter
	src     *source
	key     string
	sending bool
	closed  bool
	// idle: an HTTP/1 connection between requests (connState), read without the mutex.
	idle      atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// Read marks an idle HTTP/1 connection as sending a request's headers at its first byte.
func (c *sourceConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.idle.Load() && c.idle.CompareAndSwap(true, false) {
		c.l.mu.Lock()
		evict := c.l.sendingLocked(c)
		c.l.mu.Unlock()
		c.l.close(evict)
	}
	return n, err
}

func (c *sourceConn) Close() error {
	c.closeOnce.Do(func() {
		c.closeErr = c.Conn.Close()
		l := c.l
		l.mu.Lock()
		c.closed = true
		l.doneLocked(c)
		if c.src.conns--; c.src.conns == 0 && len(c.src.sending) == 0 {
			delete(l.sources, c.key)
		}
		l.mu.Unlock()
	})
	return c.closeErr
}

// sourceConnOf finds the sourceConn under c (a TLS connection's, or c itself).
func sourceConnOf(c net.Conn) *sourceConn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	sc, _ := c.(*sourceConn)
	return sc
}

// sourceKey is the source of a connection from addr: its IPv4 address, or its IPv6 /64.
func sourceKey(addr net.Addr) string { return sourceKeyOf(addr.String()) }

// sourceKeyOf is sourceKey of an address as a string (http.Request.RemoteAddr).
func sourceKeyOf(addr string) string {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return addr
	}
	a := ap.Addr().Unmap()
	if a.Is4() {
		return a.String()
	}
	p, _ := a.Prefix(64)
	return p.String()
}

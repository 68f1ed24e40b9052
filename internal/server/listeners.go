package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/netutil"

	"github.com/watchsan/watchsan/internal/config"
	"github.com/watchsan/watchsan/internal/shed"
)

// ListenError is a listener that could not be opened (an address in use, a port watchsan may
// not bind): a configuration problem, reported as one line with exit code 2.
type ListenError struct {
	Flag string // "listen" or "admin-listen"
	Addr string
	Err  error
}

func (e *ListenError) Error() string {
	err := e.Err
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		err = oe.Err // "bind: address already in use": the address is said once
	}
	return fmt.Sprintf("--%s %s: %v", e.Flag, e.Addr, err)
}
func (e *ListenError) Unwrap() error { return e.Err }

// Limits of the admin listener, which only serves watchsan's own small endpoints.
const (
	adminIdleTimeout   = 30 * time.Second
	adminHeaderTimeout = 10 * time.Second
	// http2MaxReadFrameSize is kube-apiserver's: most objects fit one frame, and the buffer a
	// client can make watchsan hold per stream stays small.
	http2MaxReadFrameSize = 256 << 10
	// hpackTableSize is HPACK's default dynamic table size (RFC 7541 section 6.5.2, 4 KiB).
	hpackTableSize = 4 << 10
)

// listen opens both listeners, each bounded: the main one to --max-connections (as fitted to
// the open-file limit) and, in frontend mode, per source (sources.go), the admin one to its
// own small limit, so that a client holding every
// main connection it may still leaves /healthz and /metrics answering. A connection beyond
// the main limit is answered at once with a 429 a client retries (s.overflow, overflow.go):
// in the kernel's accept backlog it waited, unanswered, until a slot freed or its client gave
// up, and watches that are never read nor closed hold their slots for good
// (docs/design.md section 14). Beyond the admin limit, connections wait in the backlog.
func (s *Server) listen() (mainLn, adminLn net.Listener, err error) {
	mainLn, err = net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return nil, nil, &ListenError{Flag: "listen", Addr: s.cfg.Listen, Err: err}
	}
	adminLn, err = net.Listen("tcp", s.cfg.AdminListen)
	if err != nil {
		mainLn.Close()
		return nil, nil, &ListenError{Flag: "admin-listen", Addr: s.cfg.AdminListen, Err: err}
	}
	s.overflow = newRefuser(mainLn.Addr(), func(reason string) { s.metrics.ConnectionsShed.WithLabelValues(reason).Inc() })
	mainLn = s.bound("main", mainLn, s.cfg.MaxConnections, s.overflow.take)
	if s.cfg.SourceConnections > 0 || s.cfg.SourceHeaderConnections > 0 {
		s.sources = newSourceLimiter(mainLn, s.cfg.SourceConnections, s.cfg.SourceHeaderConnections,
			func(reason string) { s.metrics.ConnectionsShed.WithLabelValues(reason).Inc() })
		mainLn = s.sources
	}
	return mainLn, s.bound("admin", adminLn, config.AdminMaxConnections, nil), nil
}

// bound limits ln to n connections at once and counts them in watchsan_connections; a
// connection beyond them goes to over at once, or, with over nil, waits in the backlog. On the
// main listener it also counts the connections whose write timed out (countedConn.Write).
func (s *Server) bound(name string, ln net.Listener, n int, over func(net.Conn)) net.Listener {
	s.metrics.ConnectionLimit.WithLabelValues(name).Set(float64(n))
	open := s.metrics.Connections.WithLabelValues(name)
	open.Set(0)
	limited := netutil.LimitListener(ln, n)
	if over != nil {
		limited = newLimitListener(ln, n, over)
	}
	cl := &countingListener{Listener: limited, opened: open.Inc, closed: open.Dec}
	if name == "main" {
		cl.writeTimedOut = s.metrics.ConnectionsShed.WithLabelValues("write_timeout").Inc
		cl.shedder = s.shedder
	}
	return cl
}

// newMainServer is the main listener's http.Server. Its timeouts bound what a client that says
// nothing can hold, without cutting what is legitimately long:
//   - IdleTimeout (--idle-timeout) closes a connection idle between requests (HTTP/1.1
//     keep-alive; HTTP/2 with no open stream). An open watch is a request in progress, never
//     idle, however quiet;
//   - ReadHeaderTimeout bounds the wait for a request's headers (and the TLS handshake);
//   - no ReadTimeout or WriteTimeout: they bound a whole request and its response, so they
//     would cut every watch, exec session and large upload at that age (a ReadTimeout's
//     expiry even cancels the request's context while the handler streams).
//
// A request's header list is bounded by --max-request-header-bytes (HTTP/1: 431; HTTP/2: the
// limit is announced in SETTINGS_MAX_HEADER_LIST_SIZE, a list over it gets 431 or, when far
// over, its connection closed, before it is decoded whole); the requests in progress by the
// header budgets (headers.go).
//
// HTTP/2 allows --http2-max-streams-per-connection streams per connection, with
// kube-apiserver's frame size, and bounds what a client that stops reading its socket holds
// (docs/design.md section 14): a connection that takes no byte for
// --client-http2-write-byte-timeout while there is some to send is closed (a stream's own
// write deadline only queues an RST_STREAM behind the data that cannot be written, and the
// connection, its streams' handlers and its slot stayed until the client closed it), and one
// that does not answer a ping (--client-http2-ping-interval, --client-http2-ping-timeout) is
// closed too: a client whose stream windows are spent leaves nothing to write, only the ping
// finds it.
func (s *Server) newMainServer(errLog *log.Logger) *http.Server {
	lostPing := s.metrics.ConnectionsShed.WithLabelValues("ping_timeout")
	srv := &http.Server{
		Handler:           s.Handler(),
		ErrorLog:          errLog,
		ReadHeaderTimeout: s.cfg.HeaderTimeout(),
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    s.cfg.MaxRequestHeaderBytes,
		ConnContext:       s.connContext,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: s.cfg.HTTP2MaxStreams,
			MaxReadFrameSize:     http2MaxReadFrameSize,
			// HPACK's tables at the RFC's 4 KiB default, said here: what a connection holds
			// of header fields between requests stays that small whatever the client asks.
			MaxDecoderHeaderTableSize: hpackTableSize,
			MaxEncoderHeaderTableSize: hpackTableSize,
			WriteByteTimeout:          s.cfg.ClientHTTP2WriteByteTimeout,
			SendPingTimeout:           s.cfg.ClientHTTP2PingInterval,
			PingTimeout:               s.cfg.ClientHTTP2PingTimeout,
			CountError: func(errType string) {
				// Go's HTTP/2 server names the close for a lost ping so (h2_bundle.go
				// handlePingTimer); every other error type is a protocol error, not counted.
				if errType == "conn_close_lost_ping" {
					lostPing.Inc()
				}
			},
		},
	}
	if s.sources != nil { // per-source limits (sources.go)
		srv.ConnState = s.sources.connState
	}
	return srv
}

func (s *Server) newAdminServer(errLog *log.Logger) *http.Server {
	return &http.Server{
		Handler:           s.AdminHandler(),
		ErrorLog:          errLog,
		ReadHeaderTimeout: adminHeaderTimeout,
		IdleTimeout:       adminIdleTimeout,
		MaxHeaderBytes:    64 << 10,
	}
}

// countingListener tells opened and closed about each connection it hands out, and
// writeTimedOut (nil: no one) about each whose write failed at its deadline; it puts each in
// shedder's set (nil: none) until it closes.
type countingListener struct {
	net.Listener
	opened, closed func()
	writeTimedOut  func()
	shedder        *shed.Shedder
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.opened()
	cc := &countedConn{Conn: c, closed: l.closed, writeTimedOut: l.writeTimedOut}
	if l.shedder != nil {
		cc.rebalance = openRebalance(l.shedder)
	}
	return cc, nil
}

type countedConn struct {
	net.Conn
	once   sync.Once
	closed func()
	// writeTimedOut is told once when a write fails at the connection's write deadline: Go's
	// HTTP/2 server's WriteByteTimeout, an HTTP/1 watch's --watch-write-timeout; the
	// connection is closed for it. Nil: not told.
	writeTimedOut func()
	timedOut      atomic.Bool
	// rebalance is the connection in the shedder's set (rebalance.go), taken out at Close;
	// nil: shedding is off.
	rebalance *rebalanceConn
}

func (c *countedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil && c.writeTimedOut != nil && errors.Is(err, os.ErrDeadlineExceeded) && c.timedOut.CompareAndSwap(false, true) {
		c.writeTimedOut()
	}
	return n, err
}

// countedConnKey holds a request's *countedConn in its context (connContext).
type countedConnKey struct{}

// countedOf finds the countedConn under c: ConnContext gets the connection as Accept gave it
// to net/http (a TLS server's wrapped in its *tls.Conn), the per-source limiter's around it.
func countedOf(c net.Conn) *countedConn {
	for c != nil {
		switch x := c.(type) {
		case *countedConn:
			return x
		case *tls.Conn:
			c = x.NetConn()
		case *sourceConn:
			c = x.Conn
		default:
			return nil
		}
	}
	return nil
}

// cutSlow says whether r's connection was closed because a write to it failed at its deadline
// (watch.Deps.CutSlow): its client stopped reading.
func cutSlow(r *http.Request) bool {
	cc, _ := r.Context().Value(countedConnKey{}).(*countedConn)
	return cc != nil && cc.timedOut.Load()
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.closed()
		if c.rebalance != nil {
			c.rebalance.close()
		}
	})
	return err
}

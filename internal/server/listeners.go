package server

import (
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/net/netutil"

	"github.com/watchsan/watchsan/internal/config"
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
)

// listen opens both listeners, each bounded: the main one to --max-connections (as fitted to
// the open-file limit) and, in frontend mode, per source (sources.go), the admin one to its
// own small limit, so that a client holding every
// main connection it may still leaves /healthz and /metrics answering. Connections beyond a
// limit wait in the kernel's accept backlog, costing watchsan nothing.
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
	mainLn = s.bound("main", mainLn, s.cfg.MaxConnections)
	if s.cfg.SourceConnections > 0 || s.cfg.SourceHeaderConnections > 0 {
		s.sources = newSourceLimiter(mainLn, s.cfg.SourceConnections, s.cfg.SourceHeaderConnections,
			func(reason string) { s.metrics.ConnectionsShed.WithLabelValues(reason).Inc() })
		mainLn = s.sources
	}
	return mainLn, s.bound("admin", adminLn, config.AdminMaxConnections), nil
}

// bound limits ln to n connections at once and counts them in watchsan_connections.
func (s *Server) bound(name string, ln net.Listener, n int) net.Listener {
	s.metrics.ConnectionLimit.WithLabelValues(name).Set(float64(n))
	open := s.metrics.Connections.WithLabelValues(name)
	open.Set(0)
	return &countingListener{Listener: netutil.LimitListener(ln, n), opened: open.Inc, closed: open.Dec}
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
// HTTP/2 allows --http2-max-streams-per-connection streams per connection, with
// kube-apiserver's frame size.
func (s *Server) newMainServer(errLog *log.Logger) *http.Server {
	srv := &http.Server{
		Handler:           s.Handler(),
		ErrorLog:          errLog,
		ReadHeaderTimeout: s.cfg.HeaderTimeout(),
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    1 << 20,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: s.cfg.HTTP2MaxStreams,
			MaxReadFrameSize:     http2MaxReadFrameSize,
		},
	}
	if s.sources != nil { // per-source limits (sources.go)
		srv.ConnState = s.sources.connState
		srv.ConnContext = connContext
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

// countingListener tells opened and closed about each connection it hands out.
type countingListener struct {
	net.Listener
	opened, closed func()
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.opened()
	return &countedConn{Conn: c, closed: l.closed}, nil
}

type countedConn struct {
	net.Conn
	once   sync.Once
	closed func()
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.closed)
	return err
}

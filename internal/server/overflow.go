package server

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/apistatus"
)

// Limits of the answers to connections over --max-connections (docs/design.md section 14).
const (
	// maxRefusing is how many such connections are answered at once; one more is closed
	// unanswered. Each costs a goroutine, a TLS handshake and a read of the request's headers,
	// at most refusalTimeout long.
	maxRefusing = 64
	// refusalTimeout bounds the handshake, the request's headers and the answer.
	refusalTimeout = 2 * time.Second
)

// limitListener hands out at most cap(slots) connections at once; every connection accepted
// beyond them goes to over, at once. (netutil.LimitListener waits for a slot instead, leaving
// the client in the kernel's accept backlog with no answer until its own timeout.)
type limitListener struct {
	net.Listener
	slots chan struct{}
	over  func(net.Conn)
}

func newLimitListener(ln net.Listener, n int, over func(net.Conn)) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, n), over: over}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &releasingConn{Conn: c, release: func() { <-l.slots }}, nil
		default:
			l.over(c)
		}
	}
}

// releasingConn gives its slot back at its first Close.
type releasingConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *releasingConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// refuser answers connections over the main listener's connection limit, as fast as they
// come, with what a client retries: 429 TooManyRequests, Retry-After: 1 and a Kubernetes
// Status, then the connection closed (apistatus.ShuttingDown says why 429: client-go's REST
// client repeats it after the Retry-After, and a Reflector whose watch gets it backs off and
// watches again without relisting). A TLS connection is answered after its handshake, over
// HTTP/2 if it chose it: a client that sees only a closed connection retries a GET or a
// watch (client-go's IsProbableEOF), but not a create or an update. It is a net.Listener for
// its own http.Server (newRefusalServer), which serves each connection it is handed.
type refuser struct {
	addr net.Addr
	// conns holds the connections handed over and not yet taken by the server; busy counts
	// those being answered, so that conns never holds more than maxRefusing.
	conns chan net.Conn
	busy  atomic.Int64
	// shed is told each connection over the limit: answered (max_connections) or, with
	// maxRefusing already being answered, closed at once (max_connections_unanswered).
	shed func(reason string)

	done      chan struct{}
	closeOnce sync.Once
}

func newRefuser(addr net.Addr, shed func(string)) *refuser {
	return &refuser{addr: addr, conns: make(chan net.Conn, maxRefusing), shed: shed, done: make(chan struct{})}
}

// take answers c (limitListener.over).
func (r *refuser) take(c net.Conn) {
	if r.busy.Add(1) > maxRefusing {
		r.busy.Add(-1)
		r.shed("max_connections_unanswered") // counted before the client can see the close
		c.Close()
		return
	}
	r.shed("max_connections")
	_ = c.SetDeadline(time.Now().Add(refusalTimeout)) // the handshake, the headers and the answer
	select {
	case r.conns <- &releasingConn{Conn: c, release: func() { r.busy.Add(-1) }}:
	case <-r.done:
		c.Close()
		r.busy.Add(-1)
	}
}

func (r *refuser) Accept() (net.Conn, error) {
	select {
	case c := <-r.conns:
		return c, nil
	case <-r.done:
		return nil, net.ErrClosed
	}
}

// Close stops the refuser; connections handed over and not yet served are closed.
func (r *refuser) Close() error {
	r.closeOnce.Do(func() {
		close(r.done)
		for {
			select {
			case c := <-r.conns:
				c.Close()
			default:
				return
			}
		}
	})
	return nil
}

func (r *refuser) Addr() net.Addr { return r.addr }

// newRefusalServer serves what the refuser hands over: every request gets the 429, and the
// connection is closed after it (no keep-alive; HTTP/2 sends GOAWAY once the stream is done).
// Its errors (handshakes a flood cuts short) are not logged: the metric counts the
// connections.
func (s *Server) newRefusalServer() *http.Server {
	st := apistatus.New(http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests,
		fmt.Sprintf("watchsan: all of its %d client connections (--max-connections) are in use, please try again later", s.cfg.MaxConnections))
	st.Details = &metav1.StatusDetails{RetryAfterSeconds: 1}
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { apistatus.WriteClose(w, st) }),
		ErrorLog:          log.New(io.Discard, "", 0),
		ReadHeaderTimeout: refusalTimeout,
		WriteTimeout:      refusalTimeout,
		IdleTimeout:       refusalTimeout,
		MaxHeaderBytes:    s.cfg.MaxRequestHeaderBytes,
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: 1, WriteByteTimeout: refusalTimeout},
	}
	srv.SetKeepAlivesEnabled(false)
	return srv
}

package testutil

import (
	"net"
	"sync"
)

// StallingConn is a client's connection whose reads block, once stop is closed, until it is
// closed: a client that stopped draining its socket (the server's writes fill the kernel's
// buffers, then block).
type StallingConn struct {
	net.Conn
	stop   <-chan struct{}
	closed chan struct{}
	once   sync.Once
}

// NewStallingConn wraps c; its reads stall once stop is closed.
func NewStallingConn(c net.Conn, stop <-chan struct{}) *StallingConn {
	return &StallingConn{Conn: c, stop: stop, closed: make(chan struct{})}
}

func (c *StallingConn) Read(p []byte) (int, error) {
	select {
	case <-c.stop:
		<-c.closed
		return 0, net.ErrClosed
	default:
	}
	return c.Conn.Read(p)
}

// Close closes the connection and ends a stalled Read.
func (c *StallingConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

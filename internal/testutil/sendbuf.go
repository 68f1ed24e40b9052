package testutil

import "net"

// SmallSendBuffers is a listener whose accepted connections have a 4 KiB kernel send buffer,
// so that a client that never reads blocks the server's writes after a few KiB instead of
// after the megabytes loopback's autotuning would give it.
type SmallSendBuffers struct{ net.Listener }

// Accept accepts a connection and shrinks its send buffer.
func (l SmallSendBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4 << 10)
	}
	return c, err
}

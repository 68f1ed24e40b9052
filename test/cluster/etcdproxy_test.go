package cluster

import (
	"io"
	"net"
	"testing"
	"time"
)

// The pause proxy holds data while paused, without closing anything, and delivers it on
// Resume; Close ends every connection.
func TestPauseProxyHoldsAndResumes(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	p, err := newPauseProxy(echo.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", p.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip := func(msg string, within time.Duration) (string, error) {
		if _, err := c.Write([]byte(msg)); err != nil {
			return "", err
		}
		_ = c.SetReadDeadline(time.Now().Add(within))
		buf := make([]byte, len(msg))
		_, err := io.ReadFull(c, buf)
		return string(buf), err
	}
	if got, err := roundTrip("one", 5*time.Second); err != nil || got != "one" {
		t.Fatalf("forwarding: %q %v", got, err)
	}
	p.Pause()
	if got, err := roundTrip("two", 300*time.Millisecond); err == nil {
		t.Fatalf("got %q through a paused proxy", got)
	}
	p.Resume()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 3)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "two" {
		t.Fatalf("held data after Resume: %q %v", buf, err)
	}
	p.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(buf); err == nil {
		t.Fatal("a connection survived Close")
	}
}

package upstream

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"k8s.io/utils/clock"
)

// errNoH2 means the backend did not agree to HTTP/2 (ALPN): it cannot be pinged.
var errNoH2 = errors.New("the upstream does not speak HTTP/2")

// pinger checks that a backend's process answers at all with an HTTP/2 PING on a connection
// of its own, kept open between pings. A ping is answered by the server's connection reader,
// before any handler, etcd or admission: it tells a frozen or dead apiserver (no answer) from a
// slow one (an answer, while /readyz may wait on etcd). Only the health loop of its backend
// uses it.
type pinger struct {
	addr   string
	tls    *tls.Config
	dialer *net.Dialer
	onDial func(error)

	mu   sync.Mutex // held by ping; Close may run concurrently at removal
	conn net.Conn
	fr   *http2.Framer
	seq  uint64
}

func newPinger(addr string, cfg *tls.Config, dialTimeout, keepAlive time.Duration, onDial func(error)) *pinger {
	c := cfg.Clone()
	c.NextProtos = []string{http2.NextProtoTLS}
	return &pinger{addr: addr, tls: c, dialer: &net.Dialer{Timeout: dialTimeout, KeepAlive: keepAlive}, onDial: onDial}
}

// ping sends one PING and waits for its ACK within timeout on clk (the pool's), dialling first
// when no connection is open. Any failure closes the connection, so the next ping starts on a
// fresh one.
func (p *pinger) ping(ctx context.Context, clk clock.WithDelayedExecution, timeout time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	ctx, cancel := withTimeout(ctx, clk, timeout)
	defer cancel()
	if p.conn == nil {
		if err := p.dial(ctx); err != nil {
			return err
		}
	}
	c := p.conn
	_ = c.SetDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(longAgo) }) // ends a blocked read or write
	defer stop()
	if err := p.exchange(); err != nil {
		p.closeLocked()
		if ctx.Err() != nil {
			return fmt.Errorf("no HTTP/2 PING answer within %v: %w", timeout, err)
		}
		return err
	}
	return nil
}

// once pings on a fresh connection, closed after the answer (the spare of Pool.ping).
func (p *pinger) once(ctx context.Context, clk clock.WithDelayedExecution, timeout time.Duration) error {
	defer p.Close()
	p.Close()
	return p.ping(ctx, clk, timeout)
}

// longAgo is a deadline in the past: set on a connection, it ends its blocked reads and
// writes at once (as net/http's aLongTimeAgo).
var longAgo = time.Unix(1, 0)

func (p *pinger) dial(ctx context.Context) error {
	d := &tls.Dialer{NetDialer: p.dialer, Config: p.tls}
	c, err := d.DialContext(ctx, "tcp", p.addr)
	if p.onDial != nil {
		p.onDial(err)
	}
	if err != nil {
		return err
	}
	if c.(*tls.Conn).ConnectionState().NegotiatedProtocol != http2.NextProtoTLS {
		c.Close()
		return errNoH2
	}
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		c.Close()
		return err
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		c.Close()
		return err
	}
	p.conn, p.fr = c, fr
	return nil
}

// exchange writes a PING and reads frames until its ACK. The server's SETTINGS are
// acknowledged; a GOAWAY ends the connection (the next ping dials again).
func (p *pinger) exchange() error {
	p.seq++
	var data [8]byte
	binary.BigEndian.PutUint64(data[:], p.seq)
	if err := p.fr.WritePing(false, data); err != nil {
		return err
	}
	for {
		f, err := p.fr.ReadFrame()
		if err != nil {
			return err
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if err := p.fr.WriteSettingsAck(); err != nil {
					return err
				}
			}
		case *http2.PingFrame:
			if f.IsAck() && f.Data == data {
				return nil
			}
			if !f.IsAck() {
				if err := p.fr.WritePing(true, f.Data); err != nil {
					return err
				}
			}
		case *http2.GoAwayFrame:
			return fmt.Errorf("the upstream said GOAWAY (%v)", f.ErrCode)
		}
	}
}

func (p *pinger) closeLocked() {
	if p.conn != nil {
		p.conn.Close()
		p.conn, p.fr = nil, nil
	}
}

// Close closes the connection, if any.
func (p *pinger) Close() {
	p.mu.Lock()
	p.closeLocked()
	p.mu.Unlock()
}

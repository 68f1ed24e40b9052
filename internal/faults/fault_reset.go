package faults

import (
	"context"
	"net"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/watchsan/watchsan/internal/stream"
)

// resetFault breaks a watch after every ResetEveryN events.
var resetFault = fault{
	name: "reset",
	after: func(a *active, wt *watchReq, ev *stream.Event) verdict {
		if a.ResetEveryN <= 0 || wt.events%a.ResetEveryN != 0 {
			return carryOn
		}
		wt.l.stats.resets.Add(1)
		wt.log.Info("resetting the watch (ResetEveryN)", zap.Int("events", wt.events), zap.Bool("tcp", a.ResetTCP))
		return reset
	},
}

// sendQueueTimeout bounds how long a TCP reset waits for the bytes already written to leave.
const sendQueueTimeout = 2 * time.Second

// reset breaks the response: with tcp, by resetting its TCP connection when the layer can
// reach it; otherwise (or failing that) by aborting the response, which net/http turns into
// an unfinished chunked body (HTTP/1.1) or RST_STREAM (HTTP/2). It does not return normally
// when it aborts.
func (wt *watchReq) reset(tcp bool) {
	if tcp {
		if wt.r.ProtoMajor == 1 {
			if c, _, err := http.NewResponseController(wt.w).Hijack(); err == nil {
				resetConn(c)
				return
			}
		}
		if c, ok := wt.r.Context().Value(connKey{}).(net.Conn); ok {
			resetConn(c)
			return
		}
		wt.log.Warn("cannot reach this request's TCP connection (HTTP/2 needs the server's ConnContext set to faults.ConnContext); aborting the response instead")
	}
	panic(http.ErrAbortHandler)
}

type connKey struct{}

// ConnContext is an http.Server ConnContext hook that lets the layer reach the connection a
// request came on, for ResetTCP over HTTP/2:
//
//	srv := &http.Server{Handler: layer, ConnContext: faults.ConnContext}
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// resetConn closes c with a TCP RST once what was written has left the send queue (or
// sendQueueTimeout passed). A TLS connection is cut underneath, without close_notify.
func resetConn(c net.Conn) {
	for {
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		c = u.NetConn()
	}
	if tc, ok := c.(*net.TCPConn); ok {
		waitSendQueueEmpty(tc, sendQueueTimeout)
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

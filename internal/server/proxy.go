package server

import (
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httputil"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/watchsan/watchsan/internal/apistatus"
	"github.com/watchsan/watchsan/internal/upstream"
)

// passThrough is the pass-through for everything that is not a watch: all verbs and paths,
// request and response bodies streamed, each write flushed at once (logs?follow), protocol
// upgrades (exec, attach, port-forward over SPDY or WebSocket) spliced, hop-by-hop headers
// dropped, X-Forwarded-For appended.
type passThrough struct {
	attempts *upstream.Attempter
	log      *zap.Logger
	errLog   *log.Logger
}

func newPassThrough(attempts *upstream.Attempter, log *zap.Logger) *passThrough {
	return &passThrough{attempts: attempts, log: log, errLog: zap.NewStdLog(log.Named("reverseproxy"))}
}

// serve passes r (classified as c) through with plan, whose Credentials are c's. Each request
// gets a ReverseProxy of its own, whose Transport is bound to plan: a ReverseProxy's Transport
// sees only the outgoing request, so a shared one could get the plan, and with it the
// decision about credentials, only from the request's context (a struct of a few words per
// request is the price of passing it as a value).
func (p *passThrough) serve(w http.ResponseWriter, r *http.Request, c *classified, plan upstream.Plan) {
	if r.ProtoMajor == 1 && r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 && !upstream.IsUpgrade(r.Header) {
		rc := http.NewResponseController(w)
		if rc.EnableFullDuplex() == nil {
			body := &duplexBody{ReadCloser: r.Body}
			r = r.WithContext(r.Context()) // a shallow copy: the client's request stays as it came
			r.Body = body
			defer body.finish(rc)
		}
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			// The Attempter targets each attempt at a backend; here only the forwarding headers.
			pr.Out.Host = ""
			upstream.SetForwarded(pr.Out, pr.In)
		},
		// The apiserver's 401 to the identity watchsan lends says only "Unauthorized"; the
		// client is told whose credentials it refused (a Warning, which kubectl and client-go
		// print), and the response is otherwise as it came.
		ModifyResponse: func(resp *http.Response) error {
			warnLentRefused(resp, plan.Credentials)
			return nil
		},
		Transport:     p.attempts.Transport(plan),
		FlushInterval: -1,
		ErrorLog:      p.errLog,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the client went away; nobody to answer
			}
			st := apistatus.ForUpstreamError(upstream.Name(err), err)
			lvl := zapcore.WarnLevel
			if errors.Is(err, upstream.ErrNoBackend) {
				lvl = zapcore.DebugLevel // the outage is logged once, at its transition; not per request
			}
			if ce := p.log.Check(lvl, "upstream failed before the response started"); ce != nil {
				ce.Write(zap.String("path", r.URL.Path), zap.Int32("code", st.Code), zap.Error(err),
					zap.String("remote", r.RemoteAddr), zap.String("requestID", c.id))
			}
			apistatus.Write(w, st)
		},
	}
	rp.ServeHTTP(w, r)
}

// warnLentRefused adds lentRefusedWarning to the apiserver's 401 to the identity watchsan
// lends: the pass-through's and a coalesced read's answer.
func warnLentRefused(resp *http.Response, cred upstream.Credentials) {
	if resp.StatusCode == http.StatusUnauthorized && cred.Lent() {
		resp.Header.Add("Warning", lentRefusedWarning)
	}
}

// lentRefusedWarning is the Warning (RFC 9111 section 5.5 format, code 299) added to the
// apiserver's 401 to a request that went with the identity watchsan lends.
const lentRefusedWarning = `299 - "watchsan: the apiserver refused the credentials watchsan lends (401): their token may have expired or been revoked; watchsan's /readyz?verbose says more"`

// duplexBody is the body of an HTTP/1 request served full duplex. The HTTP/1 server otherwise
// reads the rest of a request's body and closes it as soon as the response starts
// (golang/go#40747), while the upstream transport may still be reading it to send it: its
// next read fails, which ends the upstream request and cuts the response the client is
// getting (a third of 2,000 pass-through POSTs answered without their body read
// came back with headers and no body). Full duplex leaves the body to the transport; but the
// transport may still read it after the handler returned, when the server reads the
// connection for the next request ("invalid concurrent Body.Read call"), so finish ends every
// read first.
type duplexBody struct {
	io.ReadCloser
	mu      sync.Mutex
	reading int           // reads in flight
	idle    chan struct{} // closed when reading drops to 0 after finish; nil until then
	done    bool          // finish was called: no read starts
}

// duplexWait bounds how long a complete response waits for the client to send the rest of a
// body the upstream transport is still reading; then the read is cut (and the connection
// closed after the response).
const duplexWait = 5 * time.Second

var errBodyAfterResponse = errors.New("watchsan: the response is complete; the rest of the request body is not sent")

func (b *duplexBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return 0, errBodyAfterResponse
	}
	b.reading++
	b.mu.Unlock()
	n, err := b.ReadCloser.Read(p)
	b.mu.Lock()
	if b.reading--; b.reading == 0 && b.idle != nil {
		close(b.idle)
	}
	b.mu.Unlock()
	return n, err
}

// finish runs as the handler returns: no read starts from now, and one in flight (waiting for
// the client's bytes) is waited for, at most duplexWait, then cut short through the
// connection's read deadline. The server reads what is left of the body itself, as after any
// handler, or closes the connection after this response, which is complete, if it cannot.
func (b *duplexBody) finish(rc *http.ResponseController) {
	b.mu.Lock()
	b.done = true
	if b.reading == 0 {
		b.mu.Unlock()
		b.drain(rc)
		return
	}
	b.idle = make(chan struct{})
	idle := b.idle
	b.mu.Unlock()
	t := time.NewTimer(duplexWait)
	defer t.Stop()
	select {
	case <-idle:
		b.drain(rc)
	case <-t.C:
		_ = rc.SetReadDeadline(time.Now())
		<-idle
	}
}

// duplexDrain bounds what drain reads of a body nobody read to its end.
const duplexDrain = 256 << 10

// drain reads the rest of the body (what the client sends within duplexWait, at most
// duplexDrain) before the handler returns. With full duplex the server does not consume an
// unread body as the response starts; it discards it after the handler, and reaching its end
// there starts a background read of the connection that the server's own read of the next
// request then runs into: "invalid concurrent Body.Read call", a panic that cuts the
// connection (net/http, Go 1.26: finishRequest aborts pending reads before it closes the
// body). A request no upstream read (watchsan answered it: no backend, a frozen one, a
// refusal) left its connection broken. A body that does not end in time or within
// duplexDrain is left, with the read deadline passed: the connection ends after this response
// (the server's discard fails before the body's end, and so does its next read).
func (b *duplexBody) drain(rc *http.ResponseController) {
	_ = rc.SetReadDeadline(time.Now().Add(duplexWait))
	n, err := io.Copy(io.Discard, io.LimitReader(b.ReadCloser, duplexDrain))
	if err != nil || n == duplexDrain {
		_ = rc.SetReadDeadline(time.Now())
		return
	}
	_ = rc.SetReadDeadline(time.Time{})
}

package server

import (
	"errors"
	"log"
	"net/http"
	"net/http/httputil"

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
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			// The Attempter targets each attempt at a backend; here only the forwarding headers.
			pr.Out.Host = ""
			upstream.SetForwarded(pr.Out, pr.In)
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

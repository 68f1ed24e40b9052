package server

import (
	"errors"
	"net/http"
	"net/http/httputil"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/watchsan/watchsan/internal/apistatus"
	"github.com/watchsan/watchsan/internal/upstream"
)

// newProxy builds the pass-through for everything that is not a watch: all verbs and paths,
// request and response bodies streamed, each write flushed at once (logs?follow), protocol
// upgrades (exec, attach, port-forward over SPDY or WebSocket) spliced, hop-by-hop headers
// dropped, X-Forwarded-For appended.
func newProxy(attempts *upstream.Attempter, log *zap.Logger) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			// The Attempter targets each attempt at a backend; here only the forwarding headers.
			pr.Out.Host = ""
			upstream.SetForwarded(pr.Out, pr.In)
		},
		Transport:     attempts,
		FlushInterval: -1,
		ErrorLog:      zap.NewStdLog(log.Named("reverseproxy")),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the client went away; nobody to answer
			}
			st := apistatus.ForUpstreamError(upstream.Name(err), err)
			lvl := zapcore.WarnLevel
			if errors.Is(err, upstream.ErrNoBackend) {
				lvl = zapcore.DebugLevel // the outage is logged once, at its transition; not per request
			}
			if ce := log.Check(lvl, "upstream failed before the response started"); ce != nil {
				ce.Write(zap.String("path", r.URL.Path), zap.Int32("code", st.Code), zap.Error(err),
					zap.String("remote", r.RemoteAddr), zap.String("requestID", classifiedOf(r).id))
			}
			apistatus.Write(w, st)
		},
	}
}

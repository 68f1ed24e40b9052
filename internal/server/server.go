// Package server runs watchsan's listeners: the main one, where every apiserver request is
// classified and either handed to the watch pipeline or passed through, and the admin one with
// watchsan's own /metrics, /healthz and /readyz.
package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"sync/atomic"
	"time"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/watchsan/watchsan/internal/config"
	"github.com/watchsan/watchsan/internal/metrics"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/upstream"
	"github.com/watchsan/watchsan/internal/watch"
)

// Server is one running watchsan.
type Server struct {
	cfg       *config.Completed
	log       *zap.Logger
	accessLog *zap.Logger
	metrics   *metrics.Metrics
	pool      *upstream.Pool
	watch     *watch.Handler
	proxy     http.Handler

	stopping atomic.Bool
	// watchesDone ends every open watch cleanly at shutdown (clients then re-watch).
	watchesDone chan struct{}

	// Listening, if set, is told the bound addresses once both listeners are up.
	Listening func(main, admin net.Addr)
}

// New builds a server from a completed config.
func New(cfg *config.Completed, log *zap.Logger) (*Server, error) {
	s := &Server{cfg: cfg, log: log.Named("server"), accessLog: log.Named("access"), watchesDone: make(chan struct{})}
	pool, err := upstream.NewPool(cfg.Upstreams, upstream.TransportOptions{
		DialTimeout:           cfg.DialTimeout,
		TLSHandshakeTimeout:   cfg.TLSHandshakeTimeout,
		KeepAlive:             cfg.KeepAlive,
		HTTP2ReadIdleTimeout:  cfg.HTTP2ReadIdleTimeout,
		HTTP2PingTimeout:      cfg.HTTP2PingTimeout,
		ResponseHeaderTimeout: cfg.ResponseHeaderTimeout,
		RootCAs:               cfg.UpstreamCA,
		Insecure:              cfg.InsecureSkipTLSVerify,
		Credentials:           cfg.Credentials,
		Lend:                  cfg.Lend,
	}, log)
	if err != nil {
		return nil, err
	}
	pool.Interval = cfg.HealthInterval
	s.pool = pool
	wh, err := watch.New(watch.Config{
		FixMode:             cfg.FixMode,
		Exempt:              cfg.FixExemptResources,
		MaxFrameSize:        cfg.MaxFrameSize,
		DeleteMemoryEntries: cfg.DeleteMemoryEntries,
		DeleteMemoryTTL:     cfg.DeleteMemoryTTL,
		ResumeTimeout:       cfg.WatchResumeTimeout,
		StallTimeout:        cfg.WatchStallTimeout,
		DisableResume:       cfg.DisableResume,
	}, log)
	if err != nil {
		return nil, err
	}
	s.metrics = metrics.New(wh.DeleteMemoryLen)
	pool.OnHealth = func(b *upstream.Backend, ok bool) {
		v := 0.0
		if ok {
			v = 1
		}
		s.metrics.UpstreamUp.WithLabelValues(b.String()).Set(v)
	}
	rt := &upstream.Retrier{Pool: pool, Budget: cfg.RetryBudget, OnRetry: func(o string) { s.metrics.Retries.WithLabelValues(o).Inc() }}
	wh.Upstream = rt
	wh.Pool = pool
	wh.Metrics = s.metrics
	wh.Done = s.watchesDone
	s.watch = wh
	s.proxy = newProxy(rt, log)
	return s, nil
}

// Metrics exposes the server's metrics (tests and the demo read them).
func (s *Server) Metrics() *metrics.Metrics { return s.metrics }

// Handler is the main listener's handler.
func (s *Server) Handler() http.Handler {
	return refuseForeign(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info := reqinfo.Parse(r) // once per request: the log, the metrics and the route share it
		var next http.Handler = s.proxy
		if info.IsWatch() {
			next = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.watch.Serve(w, r, info) })
		}
		s.serveInstrumented(w, r, info, next)
	}))
}

// AdminHandler serves watchsan's own endpoints.
func (s *Server) AdminHandler() http.Handler {
	r := mux.NewRouter()
	r.Handle("/metrics", promhttp.HandlerFor(s.metrics.Registry, promhttp.HandlerOpts{}))
	r.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	r.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	r.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case s.stopping.Load():
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
		case !s.pool.Ready():
			http.Error(w, "no upstream answers", http.StatusServiceUnavailable)
		default:
			_, _ = w.Write([]byte("ok\n"))
		}
	})
	if s.cfg.EnablePprof {
		r.HandleFunc("/debug/pprof/", pprof.Index)
		r.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		r.HandleFunc("/debug/pprof/profile", pprof.Profile)
		r.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		r.HandleFunc("/debug/pprof/trace", pprof.Trace)
		r.PathPrefix("/debug/pprof/").HandlerFunc(pprof.Index)
	}
	return r
}

// Run serves until ctx ends, then shuts down: readiness fails, listeners close, open watches
// end cleanly (clients re-watch), short requests finish; all within the shutdown timeout, after
// which remaining connections are closed.
func (s *Server) Run(ctx context.Context) error {
	mainLn, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	adminLn, err := net.Listen("tcp", s.cfg.AdminListen)
	if err != nil {
		mainLn.Close()
		return fmt.Errorf("--admin-listen: %w", err)
	}
	errLog := zap.NewStdLog(s.log.Named("http"))
	mainSrv := &http.Server{Handler: s.Handler(), ErrorLog: errLog, ReadHeaderTimeout: 30 * time.Second}
	adminSrv := &http.Server{Handler: s.AdminHandler(), ErrorLog: errLog, ReadHeaderTimeout: 10 * time.Second}

	healthCtx, stopHealth := context.WithCancel(context.Background())
	defer stopHealth()
	go s.pool.Run(healthCtx)

	errc := make(chan error, 2)
	go func() {
		var err error
		if s.cfg.TLSCertFile != "" {
			err = mainSrv.ServeTLS(mainLn, s.cfg.TLSCertFile, s.cfg.TLSKeyFile)
		} else {
			err = mainSrv.Serve(mainLn)
		}
		errc <- err
	}()
	go func() { errc <- adminSrv.Serve(adminLn) }()

	upstreams := make([]string, 0, len(s.pool.Backends()))
	for _, b := range s.pool.Backends() {
		upstreams = append(upstreams, b.String())
	}
	s.log.Info("listening", zap.String("listen", mainLn.Addr().String()), zap.String("admin", adminLn.Addr().String()),
		zap.Bool("tls", s.cfg.TLSCertFile != ""), zap.Strings("upstreams", upstreams), zap.Bool("lendCredentials", s.cfg.Lend),
		zap.String("fixMode", s.cfg.FixMode))
	if s.Listening != nil {
		s.Listening(mainLn.Addr(), adminLn.Addr())
	}

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-errc:
		runErr = fmt.Errorf("listener failed: %w", err)
	}

	s.stopping.Store(true)
	s.log.Info("shutting down", zap.Duration("timeout", s.cfg.ShutdownTimeout))
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	shutDone := make(chan error, 1)
	go func() { shutDone <- mainSrv.Shutdown(sctx) }()
	close(s.watchesDone)
	if err := <-shutDone; err != nil {
		s.log.Warn("shutdown timed out; closing remaining connections", zap.Error(err))
		mainSrv.Close()
	}
	_ = adminSrv.Shutdown(sctx)
	s.log.Info("stopped")
	if runErr != nil && !errors.Is(runErr, http.ErrServerClosed) {
		return runErr
	}
	return nil
}

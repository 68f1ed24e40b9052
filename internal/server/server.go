// Package server runs watchsan's listeners: the main one, where every apiserver request is
// classified and either handed to the watch pipeline or passed through, and the admin one with
// watchsan's own /metrics, /healthz, /readyz and /debug/feeds, which off loopback answer only
// whom the apiserver authorizes (adminauth.go).
package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/apistatus"
	"github.com/watchsan/watchsan/internal/budget"
	"github.com/watchsan/watchsan/internal/coalesce"
	"github.com/watchsan/watchsan/internal/config"
	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/localapi"
	"github.com/watchsan/watchsan/internal/metrics"
	"github.com/watchsan/watchsan/internal/review"
	"github.com/watchsan/watchsan/internal/ring"
	"github.com/watchsan/watchsan/internal/shed"
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
	proxy     *passThrough
	// coalesce serves identical reads from one upstream read (--coalesce-reads); nil: off.
	coalesce *coalesce.Coalescer
	// local says which group-versions the apiserver serves itself (localapi); set in New.
	local *localapi.Catalog
	guard *guard
	// tls is the main listener's TLS material, reloaded when its files change; nil: plain HTTP.
	tls *tlsFiles
	// sources bounds what one source holds of the main listener; nil: no per-source limits.
	sources *sourceLimiter
	// adminAuth checks the admin listener's requests (adminauth.go); nil: it checks none
	// (on loopback, or --admin-auth=none).
	adminAuth *adminAuth
	// headers bounds the header bytes of the main listener's requests in progress.
	headers *headerBudget
	// overflow answers the main listener's connections beyond --max-connections (set by
	// listen; nil before).
	overflow *refuser
	// shedder sheds the main listener's connections above this replica's share
	// (rebalance.go); nil: off.
	shedder *shed.Shedder
	// recent holds the last rewrites, resumes, moves, absorbs and forced relists for the
	// status page (recent.go); set by New.
	recent *recentEvents

	stopping atomic.Bool
	haState  // the HA frontend: reloads, discovery (ha.go)
	// watchesDone ends every open watch cleanly at shutdown (clients then re-watch).
	watchesDone chan struct{}

	// Listening, if set, is told the bound addresses once both listeners are up.
	Listening func(main, admin net.Addr)
}

// softMemoryLimit makes Go's collector keep the heap under the container's memory limit (a
// tenth below it), or without one under twice the memory budget, unless GOMEMLIMIT says
// otherwise: with the default GOGC the heap may grow to twice what is live before a
// collection (the garbage of a buffer doubled for a big frame included), and a container
// killed at its limit ends every watch at once. What is live is bounded by the memory budget,
// half the limit by default, so the collector is not driven to run without end; if it were,
// Go caps its CPU at half (docs/design.md section 15).
func (s *Server) softMemoryLimit() {
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	limit := 2 * s.cfg.MemoryBudget
	if s.cfg.MemoryLimit > 0 {
		limit = s.cfg.MemoryLimit / 10 * 9
	}
	debug.SetMemoryLimit(limit)
	s.log.Info("Go's soft memory limit set under the container's", zap.Int64("limit", limit), zap.Int64("container", s.cfg.MemoryLimit), zap.Int64("budget", s.cfg.MemoryBudget))
}

// New builds a server from a completed config. Every part gets what it works with at
// construction: the delete memory first (the metrics report its size), then the metrics, the
// pool and its attempt loop, then the watch handler and the pass-through that use them.
func New(cfg *config.Completed, log *zap.Logger) (*Server, error) {
	s := &Server{cfg: cfg, log: log.Named("server"), accessLog: log.Named("access"), watchesDone: make(chan struct{}),
		recent: newRecentEvents(maxRecentEvents, nil)}
	if !cfg.AccessLog {
		s.accessLog = zap.NewNop()
	}
	memory := fix.NewDeleteMemory(cfg.DeleteMemoryEntries, cfg.DeleteMemoryTTL, nil)
	s.metrics = metrics.New(func() float64 { return float64(memory.Len()) })
	s.shedder = s.newShedder()
	mem := budget.New(cfg.MemoryBudget)
	s.metrics.Registry.MustRegister(mem)
	if cfg.TLSCertFile != "" {
		var err error
		reloads := s.metrics.TLSReloads
		reloads.WithLabelValues("ok")
		reloads.WithLabelValues("error")
		if s.tls, err = newTLSFiles(cfg.TLSCertFile, cfg.TLSKeyFile, cfg.ClientCAFile, log.Named("tls"),
			func(result string) { reloads.WithLabelValues(result).Inc() }); err != nil {
			return nil, err
		}
	}
	poolOpts := upstream.PoolOptions{
		Transport: upstream.TransportOptions{
			DialTimeout:           cfg.DialTimeout,
			TLSHandshakeTimeout:   cfg.TLSHandshakeTimeout,
			KeepAlive:             cfg.KeepAlive,
			HTTP2ReadIdleTimeout:  cfg.HTTP2ReadIdleTimeout,
			HTTP2PingTimeout:      cfg.HTTP2PingTimeout,
			ResponseHeaderTimeout: cfg.ResponseHeaderTimeout,
			HTTP2StreamWindow:     cfg.HTTP2StreamWindow,
			HTTP2ConnectionWindow: cfg.HTTP2ConnectionWindow,
			RootCAs:               cfg.UpstreamCA,
			Insecure:              cfg.InsecureSkipTLSVerify,
			Credentials:           cfg.Credentials,
			ProbeCredentials:      cfg.ProbeCredentials,
			Lend:                  cfg.Lend,
			StripHeaders:          cfg.Guard.StripHeaders,
			StripPrefixes:         cfg.Guard.StripPrefixes,
			Identity:              cfg.Identity,
			FrontProxyCert:        cfg.FrontProxyCert,
		},
		HealthInterval: cfg.HealthInterval,
		Logger:         log,
		OnState: func(b *upstream.Backend, st upstream.State) {
			v := 0.0
			if st == upstream.Healthy {
				v = 1
			}
			s.metrics.UpstreamUp.WithLabelValues(b.String()).Set(v)
		},
		OnDial: func(b *upstream.Backend, conn string, err error) {
			result := "ok"
			if err != nil {
				result = "error"
			}
			s.metrics.UpstreamDials.WithLabelValues(b.String(), conn, result).Inc()
		},
	}
	s.haPoolOptions(&poolOpts)
	pool, err := upstream.NewPool(cfg.Upstreams, poolOpts)
	if err != nil {
		return nil, err
	}
	s.pool = pool
	s.haMetrics()
	for _, b := range pool.Backends() { // every series from the start: alerts see 0, not "no data"
		s.metrics.UpstreamUp.WithLabelValues(b.String()).Set(0)
	}
	retries := cfg.RetryBudget
	if retries == 0 {
		retries = -1 // --retry-budget 0: no retries
	}
	attempts := upstream.NewAttempter(pool, upstream.AttempterOptions{
		Budget:  retries,
		OnRetry: func(o string) { s.metrics.Retries.WithLabelValues(o).Inc() },
		Done:    s.watchesDone,
	})
	s.attempts = attempts
	if cfg.AdminAuth.On {
		s.adminAuth = newAdminAuth(cfg.AdminAuth, attempts, log.Named("admin"))
	}
	s.local = s.localAPIs(log)
	s.watch, err = watch.New(watch.Config{
		Mode:          cfg.Fix,
		Exempt:        cfg.FixExemptResources,
		MaxFrameSize:  cfg.MaxFrameSize,
		ResumeTimeout: cfg.WatchResumeTimeout,
		StallTimeout:  cfg.WatchStallTimeout,
		WriteTimeout:  cfg.WatchWriteTimeout,
		MaxLifetime:   cfg.WatchMaxLifetime,
		DisableResume: cfg.DisableResume,

		DisableAbsorb:    !cfg.WatchAbsorbGone,
		AbsorbStateBytes: int64(cfg.WatchAbsorbStateBytes),
		AbsorbTotalBytes: int64(cfg.WatchAbsorbTotalBytes),

		AbsorbCompleteByList: cfg.WatchAbsorbCompleteByList,

		Share:                   cfg.ShareWatches,
		ShareRingBytes:          cfg.ShareRingBytes,
		ShareRingEvents:         cfg.ShareRingEvents,
		ShareRingTotalBytes:     cfg.ShareRingTotalBytes,
		ShareSubscriberBytes:    cfg.ShareSubscriberBufferBytes,
		ShareExclude:            cfg.ShareExcludeResources,
		ShareMaxFeeds:           cfg.ShareMaxFeeds,
		ShareReviewedWatchLists: cfg.ShareReviewedWatchLists,
		ShareReviewEntries:      cfg.ShareReviewCacheEntries,
	}, watch.Deps{Attempts: attempts, Metrics: s.metrics, Memory: memory, Done: s.watchesDone, Logger: log, OnBreak: s.onBreak,
		ServedLocally: s.local.Local, Budget: mem, CutSlow: cutSlow, Rebalance: s.rebalanceHook(),
		Note: func(kind string, b *upstream.Backend, path, detail string) {
			s.recent.add(kind, upstreamName(b), path, detail)
		}})
	if err != nil {
		return nil, err
	}
	for _, r := range watch.EndReasons() {
		s.metrics.StreamEnds.WithLabelValues(r.String())
	}
	for _, r := range watch.ResumeReasons() {
		s.metrics.Resumes.WithLabelValues(r.String())
	}
	for _, r := range watch.PrivateFeedReasons {
		s.metrics.PrivateFeeds.WithLabelValues(r)
	}
	for _, c := range ring.EvictionCauses {
		s.metrics.SharedRingEvictions.WithLabelValues(c)
	}
	for _, r := range watch.HandoffResults {
		s.metrics.SharedHandoffs.WithLabelValues(r)
	}
	for _, typ := range []string{"DELETED", "ADDED", "MODIFIED"} {
		s.metrics.AbsorbEvents.WithLabelValues(typ)
	}
	for _, r := range review.Results {
		s.metrics.SharedAccessReviews.WithLabelValues(r)
	}
	for _, r := range watch.SlowClientReasons {
		s.metrics.SlowClients.WithLabelValues(r)
	}
	for _, o := range []string{"retried", "recovered", "exhausted"} {
		s.metrics.Retries.WithLabelValues(o)
	}
	for _, r := range metrics.RefusalReasons {
		s.metrics.Refused.WithLabelValues(r)
	}
	s.guard = &guard{cfg.Guard}
	s.headers = newHeaderBudget(cfg.MaxHeaderBytesPerConnection, cfg.SourceHeaderBytes)
	s.proxy = newPassThrough(attempts, log.Named("proxy"))
	if cfg.CoalesceReads {
		s.coalesce = s.newCoalescer(mem)
	}
	return s, nil
}

// localAPIs is the catalog of API group-versions the apiserver serves itself, read from its
// APIServices with watchsan's own identity (ownIdentity: a frontend that lends none reads them
// with its --admin-auth-token-file token) while clients with credentials of their own share
// feeds (package localapi).
func (s *Server) localAPIs(log *zap.Logger) *localapi.Catalog {
	for _, r := range []string{"ok", "error"} {
		s.metrics.APIServiceReads.WithLabelValues(r)
	}
	return localapi.New(localapi.Options{
		Read: func(ctx context.Context, into *localapi.List) error {
			h := http.Header{}
			cred, _, err := ownIdentity(s.cfg.AdminAuth.TokenFile, h)
			if err != nil {
				return err
			}
			_, err = s.getSelf(ctx, localapi.Path, into, cred, h)
			return err
		},
		Logger: log.Named("localapi"),
		OnRead: func(ok bool) {
			r := "ok"
			if !ok {
				r = "error"
			}
			s.metrics.APIServiceReads.WithLabelValues(r).Inc()
		},
	})
}

// Metrics exposes the server's metrics (tests and the demo read them).
func (s *Server) Metrics() *metrics.Metrics { return s.metrics }

// AdminHandler serves watchsan's own endpoints.
func (s *Server) AdminHandler() http.Handler {
	r := mux.NewRouter()
	r.Handle("/metrics", promhttp.HandlerFor(s.metrics.Registry, promhttp.HandlerOpts{}))
	r.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	r.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	r.HandleFunc("/readyz", s.serveReadyz)
	// The open shared feeds (--share-watches): what each watches and delivers, how many
	// clients it serves; never who they are. Never on the main listener, whose every path is
	// the apiserver's.
	r.HandleFunc("/debug/feeds", s.watch.ServeFeeds)
	// What watchsan is doing now, for a browser (status.go); the probes' paths stay the only
	// ones open off loopback.
	r.HandleFunc("/status", s.serveStatus)
	r.HandleFunc("/status.json", s.serveStatus)
	if s.cfg.EnablePprof {
		r.HandleFunc("/debug/pprof/", pprof.Index)
		r.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		r.HandleFunc("/debug/pprof/profile", pprof.Profile)
		r.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		r.HandleFunc("/debug/pprof/trace", pprof.Trace)
		r.PathPrefix("/debug/pprof/").HandlerFunc(pprof.Index)
	}
	if !config.IsLoopback(s.cfg.AdminListen) {
		if s.adminAuth != nil {
			return s.adminAuth.wrap(r)
		}
		return r
	}
	// On loopback the admin listener is for this machine's programs, and a web page whose DNS
	// name was rebound to 127.0.0.1 could read /metrics (and pprof) otherwise: the Host must
	// name this machine as --accept-hosts says, as on the lending listener.
	accepted := s.cfg.Guard.AcceptHosts
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Host == "" || !config.MatchAny(accepted, config.HostForMatch(req.Host)) {
			s.metrics.Refused.WithLabelValues("host").Inc()
			apistatus.Write(w, apistatus.New(http.StatusForbidden, metav1.StatusReasonForbidden,
				fmt.Sprintf("watchsan: Host %q is not accepted on the admin listener, which is on loopback (a web page whose name resolves to this machine sends its own name); use a name --accept-hosts accepts", clip(req.Host))))
			return
		}
		r.ServeHTTP(w, req)
	})
}

// Run serves until ctx ends, then shuts down: readiness fails, listeners close, open watches
// end cleanly (clients re-watch), short requests finish; all within the shutdown timeout, after
// which remaining connections are closed.
func (s *Server) Run(ctx context.Context) error {
	mainLn, adminLn, err := s.listen()
	if err != nil {
		return err
	}
	s.softMemoryLimit()
	errLog := zap.NewStdLog(s.log.Named("http"))
	mainSrv, adminSrv := s.newMainServer(errLog), s.newAdminServer(errLog)

	healthCtx, stopHealth := context.WithCancel(context.Background())
	defer stopHealth()
	go s.pool.Run(healthCtx)
	go s.discover(healthCtx)
	if s.shedder != nil {
		go s.shedder.Run(healthCtx.Done()) // ends with Run
	}

	errc := make(chan error, 2)
	go func() {
		var err error
		if s.tls != nil {
			mainSrv.TLSConfig = s.tls.serverConfig()
			err = mainSrv.ServeTLS(mainLn, "", "")
		} else {
			err = mainSrv.Serve(mainLn)
		}
		errc <- err
	}()
	refusalSrv := s.newRefusalServer()
	go func() { // ends when the refuser is closed, below
		if s.tls != nil {
			refusalSrv.TLSConfig = s.tls.serverConfig()
			_ = refusalSrv.ServeTLS(s.overflow, "", "")
		} else {
			_ = refusalSrv.Serve(s.overflow)
		}
	}()
	defer refusalSrv.Close()
	defer s.overflow.Close()
	go func() { errc <- adminSrv.Serve(adminLn) }()

	upstreams := make([]string, 0, len(s.pool.Backends()))
	for _, b := range s.pool.Backends() {
		upstreams = append(upstreams, b.String())
	}
	s.log.Info("listening", zap.String("listen", mainLn.Addr().String()), zap.String("admin", adminLn.Addr().String()),
		zap.Bool("tls", s.cfg.TLSCertFile != ""), zap.Bool("adminAuth", s.adminAuth != nil), zap.Strings("upstreams", upstreams), zap.Bool("lendCredentials", s.cfg.Lend),
		zap.Stringer("identityForwarding", s.cfg.Identity), zap.Bool("clientCA", s.cfg.ClientCAFile != ""),
		zap.Stringer("fixMode", s.cfg.Fix), zap.Int("maxConnections", s.cfg.MaxConnections), zap.Duration("idleTimeout", s.cfg.IdleTimeout))
	if s.Listening != nil {
		s.Listening(mainLn.Addr(), adminLn.Addr())
	}

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-errc:
		runErr = fmt.Errorf("listener failed: %w", err)
	}

	// Readiness fails first; the listeners keep serving through the delay, so that a Service or
	// load balancer that polls readyz stops sending before anything is refused.
	s.stopping.Store(true)
	s.log.Info("shutting down", zap.Duration("delay", s.cfg.ShutdownDelay), zap.Duration("timeout", s.cfg.ShutdownTimeout))
	if runErr == nil && s.cfg.ShutdownDelay > 0 {
		t := time.NewTimer(s.cfg.ShutdownDelay)
		select {
		case <-t.C:
		case err := <-errc:
			runErr = fmt.Errorf("listener failed: %w", err)
		}
		t.Stop()
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	shutDone := make(chan error, 1)
	go func() { shutDone <- mainSrv.Shutdown(sctx) }()
	close(s.watchesDone)
	if err := <-shutDone; err != nil {
		s.log.Warn("shutdown timed out; closing remaining connections", zap.Error(err))
		mainSrv.Close()
	}
	// Shutdown waits for no hijacked connection: the watches that took theirs (shared feeds'
	// subscribers on HTTP/1.1, internal/watch/detach.go) end with their feeds, each with its
	// last chunk, and are waited for within the same timeout.
	if err := s.watch.WaitDetached(sctx); err != nil {
		s.log.Warn("shutdown timed out with detached watches open; their connections are closed", zap.Error(err))
	}
	_ = adminSrv.Shutdown(sctx)
	s.log.Info("stopped")
	if runErr != nil && !errors.Is(runErr, http.ErrServerClosed) {
		return runErr
	}
	return nil
}

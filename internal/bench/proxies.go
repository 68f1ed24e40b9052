package bench

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/http/pprof"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	restclientwatch "k8s.io/client-go/rest/watch"

	"github.com/watchsan/watchsan/internal/reqinfo"
)

// The baseline proxies, each the way a well-known peer handles a watch:
//   - pass: net/http/httputil.ReverseProxy, as kubectl proxy (apimachinery's
//     UpgradeAwareHandler) and kubegateway relay it: bytes in, bytes out, flushed per write;
//   - decode: every event decoded into a typed object with apimachinery's serializers and
//     framer (as client-go does) and encoded again as the apiserver encodes it, flushed per
//     event, the way yurthub and Teleport filter watches.
// Both run out of process (the bench binary's "proxy" subcommand) so that their CPU time and
// memory are read from /proc exactly as watchsan's are.

// upstreamTransport is the transport both baselines use: a pool per host large enough for
// every watch, HTTP/2 when the upstream offers it over TLS, and never compression.
func upstreamTransport(ca *x509.CertPool) *http.Transport {
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       &tls.Config{RootCAs: ca, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          1000,
		MaxIdleConnsPerHost:   100,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 60 * time.Second,
		DisableCompression:    true,
	}
}

// NewPassProxy is the pass-through baseline.
func NewPassProxy(upstream *url.URL, rt http.RoundTripper) http.Handler {
	return &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(upstream); r.Out.Host = r.In.Host },
		Transport: rt,
		// -1: flush after every write (the default for a response of unknown length; explicit here).
		FlushInterval: -1,
		ErrorLog:      discardLog(),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() == nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
			}
		},
	}
}

// watchUpstream is what the decode and frames baselines share: a watch goes to the upstream as
// its own request, with the client's Accept, Authorization and User-Agent and never compressed;
// anything else goes through the pass-through (pass).
type watchUpstream struct {
	upstream *url.URL
	client   *http.Client
	pass     http.Handler
}

func newWatchUpstream(upstream *url.URL, rt http.RoundTripper) watchUpstream {
	return watchUpstream{upstream: upstream, client: &http.Client{Transport: rt}, pass: NewPassProxy(upstream, rt)}
}

// open sends the watch r to the upstream and returns its response when that is a 200, for the
// caller to read and close. Otherwise it has answered w itself (the upstream's status and body,
// or 502 when the upstream could not be reached) and returns nil.
func (u watchUpstream) open(w http.ResponseWriter, r *http.Request) *http.Response {
	to := *u.upstream
	to.Path, to.RawQuery = r.URL.Path, r.URL.RawQuery
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, to.String(), nil)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return nil
	}
	for _, h := range []string{"Accept", "Authorization", "User-Agent"} {
		if v := r.Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := u.client.Do(req)
	if err != nil {
		if r.Context().Err() == nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
		}
		return nil
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		copyHeader(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
		return nil
	}
	return resp
}

// DecodeProxy is the decode/re-encode baseline: watches are decoded and re-encoded, anything
// else passes through.
type DecodeProxy struct{ watchUpstream }

// NewDecodeProxy returns the decode/re-encode baseline for upstream.
func NewDecodeProxy(upstream *url.URL, rt http.RoundTripper) *DecodeProxy {
	return &DecodeProxy{newWatchUpstream(upstream, rt)}
}

func (d *DecodeProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !reqinfo.Parse(r).IsWatch() {
		d.pass.ServeHTTP(w, r)
		return
	}
	f := formatOfAccept(r.Header.Get("Accept"))
	info, err := serializerInfo(f)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotAcceptable)
		return
	}
	resp := d.open(w, r)
	if resp == nil {
		return
	}
	defer resp.Body.Close()
	// Decoding as client-go's watch decoder does (rest.Request.newStreamWatcher); the objects
	// are core/v1 ConfigMaps here, as the request path says.
	gv := corev1.SchemeGroupVersion
	objDecoder := codecs.WithoutConversion().DecoderToVersion(info.Serializer, gv)
	fr := info.StreamSerializer.Framer.NewFrameReader(resp.Body)
	dec := restclientwatch.NewDecoder(streaming.NewDecoder(fr, info.StreamSerializer.Serializer), objDecoder)
	defer dec.Close()
	// Encoding as the apiserver's watch handler does: the object with the regular serializer,
	// embedded in a metav1.WatchEvent written with the stream serializer, framed.
	fl := w.(http.Flusher)
	enc := restclientwatch.NewEncoder(
		streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(w), codecs.EncoderForVersion(info.StreamSerializer.Serializer, gv)),
		codecs.EncoderForVersion(info.Serializer, gv))
	copyHeader(w.Header(), resp.Header)
	w.WriteHeader(http.StatusOK)
	fl.Flush()
	for {
		typ, obj, err := dec.Decode()
		if err != nil {
			return
		}
		if err := enc.Encode(&watch.Event{Type: typ, Object: obj}); err != nil {
			return
		}
		fl.Flush()
	}
}

func copyHeader(dst, src http.Header) {
	for k, vs := range src {
		if k == "Content-Length" || k == "Transfer-Encoding" || k == "Connection" {
			continue
		}
		dst[k] = append([]string(nil), vs...)
	}
}

func discardLog() *log.Logger { return log.New(io.Discard, "", 0) }

// ChildMain is the "proxy" subcommand: one baseline proxy on loopback until SIGTERM. It logs
// the JSON line {"msg":"listening","listen":ADDR} on stderr, as watchsan does.
func ChildMain(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mode := fs.String("mode", "pass", "pass (httputil.ReverseProxy), decode (apimachinery decode/re-encode) or frames (watchsan's stream.Reader, nothing else)")
	upstream := fs.String("upstream", "", "upstream URL")
	caFile := fs.String("upstream-ca-file", "", "CA that verifies an https upstream")
	listen := fs.String("listen", "127.0.0.1:0", "listen address")
	pprofListen := fs.String("pprof-listen", "", "if set, serve net/http/pprof (and /readyz) there, logged as the admin listener")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := zap.New(newJSONCore(stderr)).Named("bench-proxy")
	if err := runChild(*mode, *upstream, *caFile, *listen, *pprofListen, log); err != nil {
		log.Error("proxy failed", zap.Error(err))
		return 1
	}
	return 0
}

func runChild(mode, upstream, caFile, listen, pprofListen string, log *zap.Logger) error {
	u, err := url.Parse(upstream)
	if err != nil || u.Host == "" {
		return fmt.Errorf("--upstream %q: want a URL", upstream)
	}
	var pool *x509.CertPool
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return err
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("%s: no certificate", caFile)
		}
	}
	rt := upstreamTransport(pool)
	var h http.Handler
	switch mode {
	case "pass":
		h = NewPassProxy(u, rt)
	case "decode":
		h = NewDecodeProxy(u, rt)
	case "frames":
		h = NewFramesProxy(u, rt)
	default:
		return fmt.Errorf("--mode %q: want pass, decode or frames", mode)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second, ErrorLog: discardLog()}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	fields := []zap.Field{zap.String("listen", ln.Addr().String()), zap.String("mode", mode), zap.String("upstream", upstream)}
	if pprofListen != "" {
		// For `watchsan-bench profile -path pass`: the baseline's CPU profile, taken as watchsan's is.
		pln, err := net.Listen("tcp", pprofListen)
		if err != nil {
			_ = srv.Close()
			return err
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
		psrv := &http.Server{Handler: mux, ReadHeaderTimeout: 30 * time.Second, ErrorLog: discardLog()}
		go func() { _ = psrv.Serve(pln) }()
		defer psrv.Close()
		fields = append(fields, zap.String("admin", pln.Addr().String()))
	}
	log.Info("listening", fields...)
	select {
	case <-ctx.Done():
		_ = srv.Close()
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}

func newJSONCore(w io.Writer) zapcore.Core {
	cfg := zap.NewProductionEncoderConfig()
	cfg.EncodeTime = zapcore.ISO8601TimeEncoder
	return zapcore.NewCore(zapcore.NewJSONEncoder(cfg), zapcore.Lock(zapcore.AddSync(w)), zapcore.InfoLevel)
}

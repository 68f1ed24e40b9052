package bench

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Scenario is what every watch of one namespace receives from the Upstream.
type Scenario struct {
	Set *EventSet
	// Count is how many events of Set each watch gets (after its resourceVersion); the
	// stream then stays open, quiet, until the client leaves.
	Count int
	// Rate paces each watch's events, per second; 0 sends them as fast as the connection
	// takes them, in batches (as the apiserver flushes only when its queue is empty).
	Rate float64
	// Stamp writes the send time into each event (into a copy of the pre-encoded frame).
	Stamp bool
}

// Upstream is a synthetic kube-apiserver for watches: GET
// /api/v1/namespaces/NS/configmaps?watch=1&resourceVersion=N streams the events of NS's
// scenario after N in resourceVersion order, in the format the Accept header asks for, never
// gzipped. /readyz, /livez and /healthz answer 200. Every event is encoded beforehand, so it
// costs the upstream a copy and a write.
type Upstream struct {
	mu        sync.RWMutex
	scenarios map[string]*Scenario
	// Watches counts watches being served.
	Watches atomic.Int64
}

// NewUpstream returns an Upstream without scenarios.
func NewUpstream() *Upstream { return &Upstream{scenarios: map[string]*Scenario{}} }

// Set registers (or replaces) the scenario of namespace ns.
func (u *Upstream) Set(ns string, sc *Scenario) {
	u.mu.Lock()
	u.scenarios[ns] = sc
	u.mu.Unlock()
}

func (u *Upstream) scenario(ns string) *Scenario {
	u.mu.RLock()
	defer u.mu.RUnlock()
	return u.scenarios[ns]
}

func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/readyz", "/livez", "/healthz":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok"))
		return
	}
	segs := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if len(segs) != 5 || segs[0] != "api" || segs[1] != "v1" || segs[2] != "namespaces" || segs[4] != "configmaps" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	q := r.URL.Query()
	if r.Method != http.MethodGet || (q.Get("watch") != "1" && q.Get("watch") != "true") {
		http.Error(w, "only watches are served", http.StatusMethodNotAllowed)
		return
	}
	sc := u.scenario(segs[3])
	if sc == nil {
		http.Error(w, "no scenario for namespace "+segs[3], http.StatusNotFound)
		return
	}
	f := formatOfAccept(r.Header.Get("Accept"))
	if f != sc.Set.W.Format {
		http.Error(w, fmt.Sprintf("namespace %s serves %s, not %s", segs[3], sc.Set.W.Format, f), http.StatusNotAcceptable)
		return
	}
	if ae := r.Header.Get("Accept-Encoding"); strings.Contains(ae, "gzip") && !strings.Contains(ae, "identity") {
		// The apiserver would gzip; a proxy that parses must ask for identity. The bench's
		// client never asks for gzip, so only a proxy can have added it.
		w.Header().Set("X-Bench-Note", "gzip asked, not served")
	}
	from := sc.Set.W.BaseRV
	if v := q.Get("resourceVersion"); v != "" && v != "0" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			http.Error(w, "bad resourceVersion", http.StatusBadRequest)
			return
		}
		from = n
	}
	start := 0
	if from > sc.Set.W.BaseRV {
		start = int(min(from-sc.Set.W.BaseRV, uint64(sc.Count)))
	}
	u.Watches.Add(1)
	defer u.Watches.Add(-1)

	w.Header().Set("Content-Type", f.ContentType())
	w.Header().Set("Cache-Control", "no-cache, private")
	w.WriteHeader(http.StatusOK)
	fl := w.(http.Flusher)
	fl.Flush()
	ctx := r.Context()
	if sc.Rate > 0 {
		u.paced(ctx, w, fl, sc, start)
	} else {
		u.burst(ctx, w, fl, sc, start)
	}
	<-ctx.Done()
}

// burst writes the events in batches of about 64 KiB, copied into one buffer so that each
// batch is one chunk and one write on the connection.
func (u *Upstream) burst(ctx context.Context, w http.ResponseWriter, fl http.Flusher, sc *Scenario, start int) {
	const batch = 64 << 10
	buf := make([]byte, 0, batch+32<<10)
	for i := start; i < sc.Count; i++ {
		ev := &sc.Set.events[i]
		n := len(buf)
		buf = append(buf, ev.frame...)
		if sc.Stamp {
			putStamp(buf[n:], ev.stamp, time.Now().UnixNano())
		}
		if len(buf) >= batch {
			if _, err := w.Write(buf); err != nil {
				return
			}
			fl.Flush()
			buf = buf[:0]
			if ctx.Err() != nil {
				return
			}
		}
	}
	if len(buf) > 0 {
		if _, err := w.Write(buf); err != nil {
			return
		}
	}
	fl.Flush()
}

// paced writes and flushes each event when it is due, from a random phase so that the
// watches of a scenario do not all send at the same instant. An event sent late is sent at
// once; its timestamp is the time it was really sent.
func (u *Upstream) paced(ctx context.Context, w http.ResponseWriter, fl http.Flusher, sc *Scenario, start int) {
	interval := time.Duration(float64(time.Second) / sc.Rate)
	t0 := time.Now().Add(time.Duration(mrand.Int64N(int64(interval) + 1)))
	buf := make([]byte, 0, 16<<10)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for i := start; i < sc.Count; i++ {
		due := t0.Add(time.Duration(i-start) * interval)
		if d := time.Until(due); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		}
		ev := &sc.Set.events[i]
		buf = append(buf[:0], ev.frame...)
		if sc.Stamp {
			putStamp(buf, ev.stamp, time.Now().UnixNano())
		}
		if _, err := w.Write(buf); err != nil {
			return
		}
		fl.Flush()
	}
}

// upstreamServer is an Upstream listening on loopback, plain HTTP/1.1 and HTTPS with HTTP/2.
type upstreamServer struct {
	*Upstream
	plainURL, tlsURL string
	// caFile holds the serving certificate (self-signed), to verify the TLS listener.
	caFile  string
	caPool  *x509.CertPool
	servers []*http.Server
}

// maxStreamsPerConn is the HTTP/2 stream limit of the TLS listener: kube-apiserver's default
// (--http2-max-streams-per-connection 1000).
const maxStreamsPerConn = 1000

func startUpstream(u *Upstream, dir string) (*upstreamServer, error) {
	plainLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	tlsLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		plainLn.Close()
		return nil, err
	}
	cert, pemBytes, err := selfSigned()
	if err != nil {
		plainLn.Close()
		tlsLn.Close()
		return nil, err
	}
	caFile := dir + "/upstream-ca.pem"
	if err := writeFile(caFile, pemBytes); err != nil {
		plainLn.Close()
		tlsLn.Close()
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pemBytes)
	plain := &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second, ErrorLog: discardLog()}
	secure := &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second, ErrorLog: discardLog(),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}, MinVersion: tls.VersionTLS12},
		HTTP2:     &http.HTTP2Config{MaxConcurrentStreams: maxStreamsPerConn},
	}
	go func() { _ = plain.Serve(plainLn) }()
	go func() { _ = secure.ServeTLS(tlsLn, "", "") }()
	return &upstreamServer{Upstream: u, plainURL: "http://" + plainLn.Addr().String(), tlsURL: "https://" + tlsLn.Addr().String(),
		caFile: caFile, caPool: pool, servers: []*http.Server{plain, secure}}, nil
}

func (s *upstreamServer) Close() {
	for _, srv := range s.servers {
		_ = srv.Close()
	}
}

// selfSigned makes a certificate for 127.0.0.1 that is its own CA.
func selfSigned() (tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "watchsan-bench upstream"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pemBytes, nil
}

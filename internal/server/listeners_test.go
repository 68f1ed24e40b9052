package server

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/watchsan/watchsan/internal/config"
	wtestutil "github.com/watchsan/watchsan/internal/testutil"
)

// quietWatchUpstream answers a watch with its headers at once and its one event only when
// release is closed: a watch with nothing to say, as most are most of the time.
func quietWatchUpstream(t *testing.T, release <-chan struct{}) *httptest.Server {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") == "" {
			_, _ = io.WriteString(w, "{}")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"late","resourceVersion":"7"}}}`+"\n")
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(up.Close)
	return up
}

// running is a server started with Run.
type running struct {
	s           *Server
	main, admin string
	stop        func()
}

func runServer(t *testing.T, args ...string) *running {
	t.Helper()
	c, err := config.Load(append([]string{"--listen=127.0.0.1:0", "--admin-listen=127.0.0.1:0"}, args...))
	if err != nil {
		t.Fatal(err)
	}
	done, err := c.Complete()
	if err != nil {
		t.Fatal(err)
	}
	done.ShutdownTimeout = 2 * time.Second
	s, err := New(done, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	r := &running{s: s}
	addrs := make(chan struct{})
	s.Listening = func(m, a net.Addr) { r.main, r.admin = m.String(), a.String(); close(addrs) }
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan error, 1)
	go func() { exited <- s.Run(ctx) }()
	select {
	case <-addrs:
	case err := <-exited:
		t.Fatalf("Run: %v", err)
	}
	var once sync.Once
	r.stop = func() { once.Do(func() { cancel(); <-exited }) } // a test may stop it before its cleanup does
	t.Cleanup(r.stop)
	return r
}

// closedWithin reports whether the server closes c within d (reading whatever it sends first,
// an HTTP/2 server's SETTINGS for one).
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// TestAttackIdleConnections: a connection that says nothing, or nothing more after a request,
// is closed after --idle-timeout; a watch that is quiet for longer lives on and delivers its
// event, over HTTP/1.1 and over HTTP/2.
func TestAttackIdleConnections(t *testing.T) {
	release := make(chan struct{})
	up := quietWatchUpstream(t, release)
	certFile, keyFile := servingCert(t)
	const idle = 300 * time.Millisecond
	plain := runServer(t, "--upstream="+up.URL, "--idle-timeout="+idle.String())
	secure := runServer(t, "--upstream="+up.URL, "--idle-timeout="+idle.String(), "--tls-cert-file="+certFile, "--tls-private-key-file="+keyFile)

	// Watches first: each stays quiet well past the idle timeout.
	h2 := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, ForceAttemptHTTP2: true}}
	type watch struct {
		name string
		body io.ReadCloser
	}
	var watches []watch
	for _, w := range []struct {
		name, url string
		c         *http.Client
		proto     int
	}{
		{"HTTP/1.1", "http://" + plain.main, http.DefaultClient, 1},
		{"HTTP/2", "https://" + secure.main, h2, 2},
	} {
		resp, err := w.c.Get(w.url + "/api/v1/namespaces/default/configmaps?watch=1")
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || resp.ProtoMajor != w.proto {
			t.Fatalf("%s watch: %s %s", w.name, resp.Status, resp.Proto)
		}
		watches = append(watches, watch{w.name, resp.Body})
	}

	idleConn, err := net.Dial("tcp", plain.main)
	if err != nil {
		t.Fatal(err)
	}
	defer idleConn.Close()
	if _, err := io.WriteString(idleConn, "GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(idleConn), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	silent, err := net.Dial("tcp", plain.main)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	tlsIdle, err := tls.Dial("tcp", secure.main, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer tlsIdle.Close()
	_, _ = io.WriteString(tlsIdle, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00") // preface + empty SETTINGS
	for name, c := range map[string]net.Conn{"keep-alive after a request": idleConn, "silent": silent, "HTTP/2 without a stream": tlsIdle} {
		if !closedWithin(c, 10*idle) {
			t.Errorf("%s connection still open after %v with --idle-timeout %v", name, 10*idle, idle)
		}
	}

	close(release) // the watches have been quiet for 10 idle timeouts; now their event comes
	for _, w := range watches {
		line, err := bufio.NewReader(w.body).ReadString('\n')
		if err != nil || !strings.Contains(line, `"late"`) {
			t.Fatalf("%s watch quiet longer than --idle-timeout: %q, %v", w.name, line, err)
		}
		w.body.Close()
	}
}

// TestAttackConnectionFlood: with every main connection it may serve held by watches that are
// never read nor closed, a new request is answered at once with a 429 a client retries
// (Retry-After: 1, a Kubernetes Status), over HTTP/1.1 and over TLS with HTTP/2, instead of
// waiting unanswered in the accept backlog; the admin listener still answers /healthz and
// /metrics; a freed connection lets the next one in.
func TestAttackConnectionFlood(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	up := quietWatchUpstream(t, release)
	certFile, keyFile := servingCert(t)
	for _, tc := range []struct {
		name      string
		scheme    string
		flags     []string
		transport func() *http.Transport // a connection of its own each
		proto     int
	}{
		{"HTTP/1.1", "http", nil, func() *http.Transport { return &http.Transport{} }, 1},
		{"HTTP/2", "https", []string{"--tls-cert-file=" + certFile, "--tls-private-key-file=" + keyFile},
			func() *http.Transport {
				return &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, ForceAttemptHTTP2: true}
			}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runServer(t, append([]string{"--upstream=" + up.URL, "--max-connections=3"}, tc.flags...)...)
			base := tc.scheme + "://" + r.main
			type watch struct {
				body io.Closer
				tr   *http.Transport
			}
			var held []watch
			for i := 0; i < 3; i++ {
				tr := tc.transport()
				resp, err := (&http.Client{Transport: tr}).Get(base + "/api/v1/namespaces/default/configmaps?watch=1")
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, watch{resp.Body, tr})
			}
			m := r.s.Metrics()
			wtestutil.Eventually(t, 5*time.Second, "the 3 watches' connections to be counted", func() bool {
				return testutil.ToFloat64(m.Connections.WithLabelValues("main")) == 3
			})
			c := &http.Client{Timeout: 20 * time.Second, Transport: tc.transport()}
			start := time.Now()
			resp, err := c.Get(base + "/version")
			took := time.Since(start)
			if err != nil {
				t.Fatalf("a fourth connection with --max-connections=3: %v after %v", err, took)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Logf("answered %s in %v", resp.Status, took.Round(time.Millisecond))
			if resp.StatusCode != http.StatusTooManyRequests || resp.ProtoMajor != tc.proto || resp.Header.Get("Retry-After") != "1" ||
				!strings.Contains(string(body), `"reason":"TooManyRequests"`) || !strings.Contains(string(body), "--max-connections") {
				t.Fatalf("a fourth connection with --max-connections=3: %s %s Retry-After %q: %s", resp.Proto, resp.Status, resp.Header.Get("Retry-After"), body)
			}
			if took > time.Second {
				t.Errorf("the answer took %v; want it at once", took)
			}
			if got := testutil.ToFloat64(m.ConnectionsShed.WithLabelValues("max_connections")); got != 1 {
				t.Errorf("watchsan_connections_shed_total{reason=max_connections} = %v, want 1", got)
			}
			admin := &http.Client{Timeout: 5 * time.Second}
			for _, p := range []string{"/healthz", "/metrics"} {
				resp, err := admin.Get("http://" + r.admin + p)
				if err != nil || resp.StatusCode != 200 {
					t.Fatalf("admin %s while the main listener is saturated: %v %v", p, resp, err)
				}
				resp.Body.Close()
			}
			if testutil.ToFloat64(m.Connections.WithLabelValues("main")) != 3 || testutil.ToFloat64(m.ConnectionLimit.WithLabelValues("main")) != 3 {
				t.Fatalf("connections %v of %v", testutil.ToFloat64(m.Connections.WithLabelValues("main")), testutil.ToFloat64(m.ConnectionLimit.WithLabelValues("main")))
			}
			held[0].body.Close()
			held[0].tr.CloseIdleConnections()
			wtestutil.Eventually(t, 10*time.Second, "a freed connection to let the next one in", func() bool {
				c.CloseIdleConnections()
				resp, err := c.Get(base + "/version")
				if err != nil {
					return false
				}
				resp.Body.Close()
				return resp.StatusCode == 200
			})
			for _, h := range held[1:] {
				h.body.Close()
				h.tr.CloseIdleConnections()
			}
		})
	}
}

// TestListenFailureIsAConfigError: an address in use is reported as the flag and the cause.
func TestListenFailureIsAConfigError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s, _ := newTestServer(t, "http://127.0.0.1:1")
	s.cfg.Listen = ln.Addr().String()
	err = s.Run(context.Background())
	var le *ListenError
	if !errors.As(err, &le) || le.Flag != "listen" || err.Error() != "--listen "+ln.Addr().String()+": bind: address already in use" {
		t.Fatalf("Run: %v", err)
	}
}

// servingCert writes a self-signed serving certificate for 127.0.0.1.
func servingCert(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "watchsan"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

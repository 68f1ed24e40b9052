//lint:file-ignore SA1019 x/net's HTTP/2 Transport, deprecated for net/http's, is the one whose connection a test can stall on purpose (one connection, every stream on it)

package server

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"

	wtestutil "github.com/watchsan/watchsan/internal/testutil"
)

// endlessUpstream answers every GET with a body that never ends, as fast as it is taken: a
// response that fills whatever a client that stopped reading leaves to fill.
func endlessUpstream(t *testing.T) *httptest.Server {
	t.Helper()
	chunk := make([]byte, 32<<10)
	for i := range chunk {
		chunk[i] = 'x'
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		for r.Context().Err() == nil {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	t.Cleanup(up.Close)
	return up
}

// stopReading opens streams GETs on one HTTP/2 connection (x/net's Transport over TLS) to
// addr, reads the start of each response, then stops reading the connection. It returns when
// the client reads no more.
func stopReading(t *testing.T, addr string, streams int) {
	t.Helper()
	stop := make(chan struct{})
	tr := &http2.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}},
		DialTLSContext: func(ctx context.Context, network, addr string, cfg *tls.Config) (net.Conn, error) {
			raw, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// The kernel holds little for it (above the loopback MSS: a window below it stalls the
			// sender on its persist timer while the client still reads).
			_ = raw.(*net.TCPConn).SetReadBuffer(256 << 10)
			sc := wtestutil.NewStallingConn(raw, stop)
			tc := tls.Client(sc, cfg)
			if err := tc.HandshakeContext(ctx); err != nil {
				raw.Close()
				return nil, err
			}
			t.Cleanup(func() { sc.Close() })
			return tc, nil
		},
	}
	t.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr}
	started := make(chan error, streams)
	for i := 0; i < streams; i++ {
		go func() {
			resp, err := c.Get("https://" + addr + "/api/v1/namespaces/default/configmaps")
			if err != nil {
				started <- err
				return
			}
			_, err = io.ReadFull(resp.Body, make([]byte, 1024))
			started <- err
		}()
	}
	for i := 0; i < streams; i++ {
		if err := <-started; err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	close(stop)
}

// TestAttackHTTP2ClientStopsReading: an HTTP/2 client that stops draining its socket while
// watchsan has data for it loses its connection within the configured bounds, and with it
// its streams' handlers and its slot of --max-connections: once by the write-byte timeout
// (the socket is full: several streams' windows are more than the kernel buffers), once by
// the ping (one stream whose window the buffers take whole: nothing is left to write, and
// only an unanswered ping shows the client is not there). Without either, the connection
// stays open until the client closes it.
func TestAttackHTTP2ClientStopsReading(t *testing.T) {
	up := endlessUpstream(t)
	certFile, keyFile := servingCert(t)
	for _, tc := range []struct {
		name    string
		flags   []string
		streams int
		reason  string
	}{
		{"write-byte-timeout", []string{"--client-http2-write-byte-timeout=1s", "--client-http2-ping-interval=0"}, 4, "write_timeout"},
		{"ping", []string{"--client-http2-write-byte-timeout=0", "--client-http2-ping-interval=500ms", "--client-http2-ping-timeout=500ms"}, 1, "ping_timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runServer(t, append([]string{"--upstream=" + up.URL, "--tls-cert-file=" + certFile, "--tls-private-key-file=" + keyFile}, tc.flags...)...)
			m := r.s.Metrics()
			stopReading(t, r.main, tc.streams)
			stopped := time.Now()
			if got := testutil.ToFloat64(m.Connections.WithLabelValues("main")); got != 1 {
				t.Fatalf("%v main connections open, want the client's 1", got)
			}
			wtestutil.Eventually(t, 15*time.Second, "the stalled client's connection to be closed", func() bool {
				return testutil.ToFloat64(m.Connections.WithLabelValues("main")) == 0
			})
			t.Logf("closed %v after the client stopped reading", time.Since(stopped).Round(10*time.Millisecond))
			wtestutil.Eventually(t, 5*time.Second, "its handlers to return", func() bool {
				return testutil.ToFloat64(m.InFlight) == 0
			})
			if got := testutil.ToFloat64(m.ConnectionsShed.WithLabelValues(tc.reason)); got != 1 {
				t.Errorf("watchsan_connections_shed_total{reason=%q} = %v, want 1", tc.reason, got)
			}
		})
	}
}

package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/watchsan/watchsan/internal/memapi"
	"github.com/watchsan/watchsan/internal/shed"
	wtestutil "github.com/watchsan/watchsan/internal/testutil"
)

// bodyWatch is a watch's response body as a client reads it.
type bodyWatch struct {
	mu   sync.Mutex
	body []byte
	err  error // how the read ended; nil while it goes on
}

func (b *bodyWatch) read(r io.ReadCloser) {
	defer r.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		b.mu.Lock()
		b.body = append(b.body, buf[:n]...)
		b.err = err
		b.mu.Unlock()
		if err != nil {
			return
		}
	}
}

func (b *bodyWatch) state() ([]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.body...), b.err
}

// TestRebalanceShedsTheOldestConnectionCleanly: over its limit, the shedder picks the oldest
// connection; each watch on it ends cleanly (the client reads every event and EOF, no cut
// stream), its stream end and the shed are counted, and a watch the client sends again on
// that connection is answered 429 with Retry-After and Connection: close (HTTP/2: a GOAWAY),
// so that its next one goes on a new connection; the other connections' watches go on. Over
// HTTP/1.1 and HTTP/2, shared feeds and private ones.
func TestRebalanceShedsTheOldestConnectionCleanly(t *testing.T) {
	certFile, keyFile := servingCert(t)
	for _, tc := range []struct {
		name  string
		h2    bool
		share bool
	}{{"http1-shared", false, true}, {"http1-private", false, false}, {"http2-shared", true, true}, {"http2-private", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			api := memapi.New(nil)
			up := httptest.NewUnstartedServer(api)
			up.EnableHTTP2 = true
			up.StartTLS()
			t.Cleanup(up.Close)
			t.Cleanup(api.Close)
			args := []string{"--max-connections-per-source=-1", "--frontend-replicas=2", "--frontend-expected-connections=2",
				fmt.Sprintf("--share-watches=%v", tc.share)}
			scheme := "http"
			if tc.h2 {
				args = append(args, "--tls-cert-file="+certFile, "--tls-private-key-file="+keyFile)
				scheme = "https"
			}
			cfg := lendingConfig(t, up.URL, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: up.Certificate().Raw}), args...)
			s, err := New(cfg, zap.NewNop())
			if err != nil {
				t.Fatal(err)
			}
			if s.shedder == nil || promtest.ToFloat64(s.metrics.ConnectionRebalanceLimit) != 10 {
				t.Fatalf("shedder %v, limit %v; want one at the floor, 10", s.shedder, promtest.ToFloat64(s.metrics.ConnectionRebalanceLimit))
			}
			// The test's shedder: a stepped clock and no floor, so that a third connection is
			// over the limit of 2.
			clk := clocktesting.NewFakeClock(time.Now())
			s.shedder = shed.New(shed.Options{Replicas: 2, Expected: 2, Rate: 1, Clock: clk, OnShed: s.metrics.ConnectionsShed.WithLabelValues("rebalance").Inc})
			addrs := make(chan string, 1)
			s.Listening = func(m, _ net.Addr) { addrs <- m.String() }
			ctx, cancel := context.WithCancel(context.Background())
			exited := make(chan error, 1)
			go func() { exited <- s.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-exited })
			base := scheme + "://" + <-addrs
			m := s.Metrics()

			rv := api.ResourceVersion()
			createConfigmap(t, api, "before")
			// Three clients, each on a connection of its own, a second apart; the first
			// watches twice on its one.
			var clients []*http.Client
			var watches [][]*bodyWatch
			watch := func(i int) (*http.Response, error) {
				return clients[i].Get(fmt.Sprintf("%s/api/v1/namespaces/d/configmaps?watch=true&resourceVersion=%d", base, rv))
			}
			for i := range 3 {
				tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, ForceAttemptHTTP2: tc.h2}
				t.Cleanup(tr.CloseIdleConnections)
				clients = append(clients, &http.Client{Transport: tr})
				n := 1
				if i == 0 && tc.h2 {
					n = 2 // HTTP/2: two watches on the one connection
				}
				watches = append(watches, nil)
				for range n {
					resp, err := watch(i)
					if err != nil || resp.StatusCode != http.StatusOK {
						t.Fatalf("watch %d: %v %v", i, err, resp)
					}
					if got := resp.ProtoMajor == 2; got != tc.h2 {
						t.Fatalf("watch %d over %s", i, resp.Proto)
					}
					b := &bodyWatch{}
					go b.read(resp.Body)
					watches[i] = append(watches[i], b)
				}
				clk.Step(time.Second)
			}
			wtestutil.Eventually(t, 10*time.Second, "three connections", func() bool {
				return promtest.ToFloat64(m.Connections.WithLabelValues("main")) == 3
			})
			if s.shedder.Step() {
				t.Fatal("shed a connection whose watch began a second ago")
			}
			clk.Step(rebalanceWatchAge)
			if !s.shedder.Step() {
				t.Fatal("shed nothing at three connections over a limit of 2")
			}
			if s.shedder.Step() {
				t.Fatal("shed a second connection at the limit")
			}
			for _, b := range watches[0] {
				wtestutil.Eventually(t, 10*time.Second, "the shed connection's watch to end", func() bool {
					_, err := b.state()
					return err != nil
				})
				if body, err := b.state(); err != io.EOF || !bytes.Contains(body, []byte(`"before"`)) {
					t.Errorf("the shed watch ended with %v after %q; want every event and a clean end", err, body)
				}
			}
			if got := promtest.ToFloat64(m.ConnectionsShed.WithLabelValues("rebalance")); got != 1 {
				t.Errorf("connections shed to rebalance %v, want 1", got)
			}
			wtestutil.Eventually(t, 10*time.Second, "the stream ends counted", func() bool {
				return promtest.ToFloat64(m.StreamEnds.WithLabelValues("rebalance")) == float64(len(watches[0]))
			})
			if tc.h2 {
				// The client watches again on the connection it has: 429, Retry-After,
				// Connection: close; its GOAWAY sends the next watch to a new connection.
				resp, err := watch(0)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" {
					t.Errorf("a watch on the shed connection: %d, Retry-After %q; want 429 and 1", resp.StatusCode, resp.Header.Get("Retry-After"))
				}
				if got := promtest.ToFloat64(m.Refused.WithLabelValues("rebalance")); got != 1 {
					t.Errorf("watches refused on a shed connection %v, want 1", got)
				}
			}
			resp, err := watch(0)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("the shed client's watch on a new connection: %v %v", err, resp)
			}
			again := &bodyWatch{}
			go again.read(resp.Body)
			wtestutil.Eventually(t, 10*time.Second, "the shed connection closed, the new one open", func() bool {
				return promtest.ToFloat64(m.Connections.WithLabelValues("main")) == 3
			})
			createConfigmap(t, api, "after")
			for _, b := range append([]*bodyWatch{again}, watches[1][0], watches[2][0]) {
				wtestutil.Eventually(t, 10*time.Second, "the event after the shed", func() bool {
					body, _ := b.state()
					return bytes.Contains(body, []byte(`"after"`))
				})
			}
		})
	}
}

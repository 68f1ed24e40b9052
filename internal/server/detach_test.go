package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"strings"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/watchsan/watchsan/internal/memapi"
	wtestutil "github.com/watchsan/watchsan/internal/testutil"
)

// wire is one raw HTTP/1.1 connection's watch: its head and its body as sent (chunked).
type wire struct {
	c    net.Conn
	head string
	mu   sync.Mutex
	body []byte
	err  error // how the read ended; nil while it goes on
}

// dialWatch sends a watch of configmaps in d from rv to addr on a connection of its own.
func dialWatch(t *testing.T, addr string, rv uint64) *wire {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "GET /api/v1/namespaces/d/configmaps?watch=true&resourceVersion=%d HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: detach-test\r\n\r\n", rv)
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	w := &wire{c: c}
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("the response head: %v (so far %q)", err, w.head)
		}
		w.head += line
		if line == "\r\n" {
			break
		}
	}
	_ = c.SetReadDeadline(time.Time{})
	if !strings.HasPrefix(w.head, "HTTP/1.1 200 ") {
		t.Fatalf("the watch was answered\n%s", w.head)
	}
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := br.Read(buf)
			w.mu.Lock()
			w.body = append(w.body, buf[:n]...)
			w.err = err
			w.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return w
}

// decoded is the body as the client decodes it so far; complete: it ended with the last chunk.
func (w *wire) decoded() (body []byte, complete bool, err error) {
	w.mu.Lock()
	raw, err := append([]byte(nil), w.body...), w.err
	w.mu.Unlock()
	body, derr := io.ReadAll(httputil.NewChunkedReader(bytes.NewReader(raw)))
	return body, derr == nil, err
}

// detachServer runs a server (Run, real listeners) sharing watches in lending mode in front of
// a memapi, at most two connections per source, with its access log observed.
func detachServer(t *testing.T) (s *Server, api *memapi.Server, addr string, logs *observer.ObservedLogs, stop func() error) {
	t.Helper()
	api = memapi.New(nil)
	up := httptest.NewUnstartedServer(api)
	up.EnableHTTP2 = true
	up.StartTLS()
	t.Cleanup(up.Close)
	t.Cleanup(api.Close)
	cfg := lendingConfig(t, up.URL, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: up.Certificate().Raw}),
		"--share-watches", "--max-connections-per-source=2")
	cfg.ShutdownTimeout = 10 * time.Second
	core, logs := observer.New(zap.DebugLevel)
	s, err := New(cfg, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	addrs := make(chan struct{})
	s.Listening = func(m, _ net.Addr) { addr = m.String(); close(addrs) }
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan error, 1)
	go func() { exited <- s.Run(ctx) }()
	select {
	case <-addrs:
	case err := <-exited:
		t.Fatalf("Run: %v", err)
	}
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() { cancel(); runErr = <-exited })
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return s, api, addr, logs, stop
}

func createConfigmap(t *testing.T, api *memapi.Server, name string) {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/api/v1/namespaces/d/configmaps",
		strings.NewReader(fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":%q}}`, name)))
	req.Header.Set("Content-Type", "application/json")
	api.ServeHTTP(rec, req)
	if rec.Code != http.StatusCreated {
		t.Fatalf("create %s: %d %s", name, rec.Code, rec.Body)
	}
}

// Through the whole server, a shared watch on HTTP/1.1 detaches from its handler, and what
// ended with the handler ends with its stream: it stays counted against the per-source
// connection limit while open (a source at its limit is refused more), the request is in
// flight until then, and its access log line comes when its client leaves, with the bytes it
// was sent. At shutdown the server ends the detached watches cleanly (the last chunk) and
// waits for them before Run returns.
func TestDetachedWatchThroughServer(t *testing.T) {
	s, api, addr, logs, stop := detachServer(t)
	m := s.Metrics()
	createConfigmap(t, api, "before")
	rv := api.ResourceVersion()
	a, b := dialWatch(t, addr, rv), dialWatch(t, addr, rv)
	wtestutil.Eventually(t, 10*time.Second, "two detached watches", func() bool {
		return s.watch.DetachedWatches() == 2 && promtest.ToFloat64(m.SharedSubscribers) == 2
	})
	if !strings.Contains(a.head, "\r\nConnection: close\r\n") || !strings.Contains(a.head, "\r\nTransfer-Encoding: chunked\r\n") {
		t.Errorf("a detached watch's head:\n%s", a.head)
	}
	if got := promtest.ToFloat64(m.InFlight); got != 2 {
		t.Errorf("%v requests in flight, want the 2 detached watches", got)
	}

	// The source holds 2 connections, its limit: a third is closed at once.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil || isTimeout(err) {
		t.Errorf("a third connection from the source read %d bytes, %v; want it closed", n, err)
	}
	if got := promtest.ToFloat64(m.ConnectionsShed.WithLabelValues("source_connections")); got != 1 {
		t.Errorf("connections shed %v, want 1", got)
	}

	createConfigmap(t, api, "cm-0")
	wtestutil.Eventually(t, 10*time.Second, "the event at a", func() bool {
		body, _, _ := a.decoded()
		return bytes.Contains(body, []byte(`"cm-0"`))
	})
	sent, _, _ := a.decoded()
	if n := logs.FilterMessage("request").Len(); n != 0 {
		t.Errorf("%d access log lines while both watches are open", n)
	}
	a.c.Close()
	wtestutil.Eventually(t, 10*time.Second, "a's access log line", func() bool { return logs.FilterMessage("request").Len() == 1 })
	line := logs.FilterMessage("request").All()[0].ContextMap()
	if line["verb"] != "watch" || line["code"] != int64(200) || line["bytes"] != int64(len(sent)) ||
		line["path"] != "/api/v1/namespaces/d/configmaps" || line["remote"] != a.c.LocalAddr().String() || line["userAgent"] != "detach-test" {
		t.Errorf("a's access log line %v; want a watch of configmaps from %s, 200, %d bytes", line, a.c.LocalAddr(), len(sent))
	}
	if got := promtest.ToFloat64(m.Bytes.WithLabelValues("upstream_to_client")); got != float64(len(sent)) {
		t.Errorf("upstream_to_client bytes %v, want %d", got, len(sent))
	}
	wtestutil.Eventually(t, 10*time.Second, "a out of flight and off the feed", func() bool {
		return promtest.ToFloat64(m.InFlight) == 1 && promtest.ToFloat64(m.SharedSubscribers) == 1 && s.watch.DetachedWatches() == 1
	})
	// Its connection is no longer counted: the source may open one again.
	c2 := dialWatch(t, addr, rv)

	// Shutdown: both open watches end with the last chunk, and Run returns after.
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for name, w := range map[string]*wire{"b": b, "c2": c2} {
		wtestutil.Eventually(t, 10*time.Second, name+"'s stream to end", func() bool {
			_, _, err := w.decoded()
			return err != nil
		})
		body, complete, err := w.decoded()
		if !complete || err != io.EOF || !bytes.Contains(body, []byte(`"cm-0"`)) {
			t.Errorf("%s ended with %v, complete %v, body %s; want every event, the last chunk and EOF", name, err, complete, body)
		}
	}
	if n := s.watch.DetachedWatches(); n != 0 {
		t.Errorf("%d detached watches after Run returned", n)
	}
	if got := promtest.ToFloat64(m.InFlight); got != 0 {
		t.Errorf("%v requests in flight after Run returned", got)
	}
	if n := logs.FilterMessage("request").Len(); n != 3 {
		t.Errorf("%d access log lines, want 3", n)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

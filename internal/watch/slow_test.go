package watch

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/watchsan/watchsan/internal/testutil"
)

// streamForever answers a watch with events of 8 KiB objects, as fast as the connection takes
// them, until the watch is cancelled; then it closes u.canceled. With gzip, it says the body
// is gzipped (it is not: watchsan relays such a body unparsed).
func streamForever(u *upstreamScript, gzip bool) func(w http.ResponseWriter, r *http.Request) {
	var once sync.Once // a resume (the test failing) ends a second attempt
	return func(w http.ResponseWriter, r *http.Request) {
		defer once.Do(func() { close(u.canceled) })
		w.Header().Set("Content-Type", "application/json")
		if gzip {
			w.Header().Set("Content-Encoding", "gzip")
		}
		w.WriteHeader(200)
		pad := strings.Repeat("x", 8<<10)
		for rv := 10; r.Context().Err() == nil; rv++ {
			if _, err := fmt.Fprintf(w, `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"c%d","namespace":"d","resourceVersion":"%d"},"data":{"k":%q}}}`+"\n", rv, rv, pad); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}
}

// a client that stops reading, against an upstream streaming at full speed.
// A write to it that does not complete within the write timeout ends its watch, counted as a
// slow client, and closes the upstream watch (nothing is held for it any longer). The time the
// watch spends blocked on its client is no silence of the upstream's: the stall timeout here is
// far shorter than the write timeout, and no stall may be counted nor any resume made (before,
// the watchdog counted only upstream reads, and took the blocked client for a silent upstream).
// Over HTTP/1 a connection reports the deadline; over HTTP/2 the stream is reset at it. A watch
// relayed unparsed (here: gzipped) has the same bound.
func TestClientThatStopsReadingEndsAsSlowNotStalled(t *testing.T) {
	for _, tc := range []struct {
		proto string
		gzip  bool
	}{{"HTTP/1.1", false}, {"HTTP/2", false}, {"HTTP/1.1", true}} {
		proto, what := tc.proto, slowEvents
		if tc.gzip {
			what = slowRelayed
		}
		t.Run(proto+" "+what, func(t *testing.T) {
			up := &upstreamScript{canceled: make(chan struct{})}
			up.steps = []func(http.ResponseWriter, *http.Request){streamForever(up, tc.gzip)}
			// The stall timeout is well below the write timeout, and well above what a streaming
			// upstream in this process is ever silent for on a loaded machine.
			const writeTimeout = 2500 * time.Millisecond
			f := newFixture(t, Config{StallTimeout: time.Second, WriteTimeout: writeTimeout}, up)
			path := "/api/v1/namespaces/d/configmaps?watch=true&resourceVersion=5"
			start := time.Now()
			if proto == "HTTP/1.1" {
				c, err := net.Dial("tcp", strings.TrimPrefix(f.srv.URL, "http://"))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				_ = c.(*net.TCPConn).SetReadBuffer(4 << 10)
				if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
					t.Fatal(err)
				}
			} else {
				srv := httptest.NewUnstartedServer(f.h)
				srv.EnableHTTP2 = true
				srv.StartTLS()
				defer srv.Close()
				resp, err := srv.Client().Get(srv.URL + path) // its body is never read
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				if resp.ProtoMajor != 2 {
					t.Fatalf("served over %s, want HTTP/2", resp.Proto)
				}
			}
			slow := func() float64 { return promtest.ToFloat64(f.m.SlowClients.WithLabelValues(what)) }
			if !testutil.Until(10*time.Second, func() bool { return slow() == 1 }) {
				t.Fatalf("a client that took nothing for %v: slow clients %v after %v, stream ends %v", writeTimeout, slow(), time.Since(start),
					promtest.ToFloat64(f.m.StreamEnds.WithLabelValues(EndSlowClient.String())))
			}
			if took := time.Since(start); took < writeTimeout {
				t.Fatalf("ended as slow after %v, before the write timeout %v", took, writeTimeout)
			}
			select {
			case <-up.canceled:
			case <-time.After(5 * time.Second):
				t.Fatal("the upstream watch is still open 5s after its client was found slow")
			}
			if v := promtest.ToFloat64(f.m.StreamEnds.WithLabelValues(EndSlowClient.String())); v != 1 && !tc.gzip { // a relayed response is no stream of watchsan's
				t.Fatalf("stream ends{slow-client} = %v, want 1", v)
			}
			var resumes float64
			for _, r := range ResumeReasons() {
				resumes += promtest.ToFloat64(f.m.Resumes.WithLabelValues(r.String()))
			}
			if s := promtest.ToFloat64(f.m.Stalls); s != 0 || resumes != 0 || up.attempts() != 1 {
				t.Fatalf("the upstream was blamed for its client: %v stalls, %v resumes, %d upstream attempts", s, resumes, up.attempts())
			}
		})
	}
}

// A watch that writes nothing for longer than the write timeout (its upstream is quiet) is no
// slow client: the deadline bounds a write, not the time between writes. Over HTTP/2 a write
// deadline is the stream's, and resets it when it passes, write or no write, so it must not
// outlive the write it was set for.
func TestQuietWatchOutlivesTheWriteTimeout(t *testing.T) {
	for _, proto := range []string{"HTTP/1.1", "HTTP/2"} {
		t.Run(proto, func(t *testing.T) {
			up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){func(w http.ResponseWriter, r *http.Request) {
				send(w, obj("ADDED", "a", "10"))
				select { // quiet for three write timeouts
				case <-time.After(1500 * time.Millisecond):
				case <-r.Context().Done():
					return
				}
				send(w, obj("MODIFIED", "a", "11"))
			}}}
			f := newFixture(t, Config{DisableResume: true, StallTimeout: 10 * time.Second, WriteTimeout: 500 * time.Millisecond}, up)
			if proto == "HTTP/2" {
				srv := httptest.NewUnstartedServer(f.h)
				srv.EnableHTTP2 = true
				srv.StartTLS()
				defer srv.Close()
				f.srv = srv
			}
			c := f.srv.Client()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", f.srv.URL+"/api/v1/namespaces/d/configmaps?watch=true&resourceVersion=5", nil)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.Proto != strings.Replace(proto, "HTTP/2", "HTTP/2.0", 1) {
				t.Fatalf("served over %s, want %s", resp.Proto, proto)
			}
			b, err := io.ReadAll(resp.Body)
			if err != nil || strings.Count(string(b), "\n") != 2 {
				t.Fatalf("a quiet watch over %s with a 500ms write timeout: %v after %q", proto, err, b)
			}
			if v := promtest.ToFloat64(f.m.SlowClients.WithLabelValues(slowEvents)); v != 0 {
				t.Fatalf("slow clients %v, want 0", v)
			}
		})
	}
}

package e2e

// The hardening attack suite: each test is one attack as it was measured against main
// before the fix, and fails when the fix that stops it is removed.

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/test/cluster"
)

// TestAttackConnectionHeaderLendsToken: a request with `Authorization: Bearer junk` and
// `Connection: Authorization`, from a foreign Host and Origin, on an exec path, got 200 and
// the upstream received the lent token: the guard skipped every check for a request with its
// own Authorization, the hop-by-hop removal then deleted that header because Connection named
// it, and the transport decided again on the stripped request and lent. The same worked on a
// watch, over HTTP/1.0 and with `Connection: Upgrade, Authorization`. Now the decision is made
// once, on the request as the client sent it, and a Connection header that names
// Authorization, an identity header or Host is refused: nothing reaches the upstream.
func TestAttackConnectionHeaderLendsToken(t *testing.T) {
	up := newTLSUpstream(t, nil)
	kc := up.kubeconfig(t, "", "lent-token", "", "")
	p := startProxy(t, "--kubeconfig="+kc)
	addr := strings.TrimPrefix(p.URL, "http://")
	const foreign = "Host: evil.example:8001\r\nOrigin: http://evil.example\r\nAuthorization: Bearer junk\r\n"
	exec := "/api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true&stdout=true"
	for _, tc := range []struct{ name, req string }{ // the first four are the attack
		{"exec", "POST " + exec + " HTTP/1.1\r\n" + foreign + "Connection: Authorization\r\nContent-Length: 0\r\n\r\n"},
		{"exec upgrade", "POST " + exec + " HTTP/1.1\r\n" + foreign + "Connection: Upgrade, Authorization\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n\r\n"},
		{"watch", "GET /api/v1/namespaces/default/secrets?watch=true HTTP/1.1\r\n" + foreign + "Connection: Authorization\r\n\r\n"},
		{"HTTP/1.0", "GET /api/v1/namespaces/default/secrets HTTP/1.0\r\nAuthorization: Bearer junk\r\nConnection: authorization\r\n\r\n"},
		{"Connection names X-Remote-User", "GET /api/v1/namespaces/default/secrets HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: X-Remote-User\r\n\r\n"},
		{"Connection names Impersonate-User", "GET /api/v1/namespaces/default/secrets HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer own\r\nImpersonate-User: admin\r\nConnection: impersonate-user\r\n\r\n"},
		{"Connection names Host", "GET /api/v1/namespaces/default/secrets HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive, Host\r\n\r\n"},
	} {
		code, body := rawHTTP(t, addr, tc.req)
		seen := up.take()
		for _, s := range seen {
			if s.auth == "Bearer lent-token" && strings.Contains(tc.req, "Bearer junk") {
				t.Errorf("%s: the lent token reached the upstream (%s %s, answered %d)", tc.name, s.proto, s.path, code)
			}
		}
		if code != 400 || len(seen) != 0 {
			t.Errorf("%s: %d %s, %d requests upstream; want 400 and none", tc.name, code, body, len(seen))
			continue
		}
		if st := watchsanStatus(t, body); !strings.Contains(st.Message, "Connection") {
			t.Errorf("%s: message %q does not say it is the Connection header", tc.name, st.Message)
		}
	}
	if n := p.Metric("watchsan_requests_refused_total", map[string]string{"reason": "connection_header"}); n != 7 {
		t.Errorf("watchsan_requests_refused_total{reason=connection_header} = %v, want 7", n)
	}
	// Connection with hop-by-hop names only (keep-alive, close, Upgrade) is what clients send.
	if code, body := rawHTTP(t, addr, "GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive, close\r\n\r\n"); code != 200 {
		t.Fatalf("Connection: keep-alive, close: %d %s", code, body)
	}
	if s := up.take(); len(s) != 1 || s[0].auth != "Bearer lent-token" {
		t.Fatalf("a plain lent request reached the upstream as %+v", s)
	}
}

// streamingUpstream is an apiserver stand-in over TLS with HTTP/2 that answers every watch
// with JSON events of 32 KiB objects (few events per byte: the upstream, not the parsing, sets the pace), written as fast as the connection takes them, until the
// watch ends; open counts the watches being served.
type streamingUpstream struct {
	*httptest.Server
	open    atomic.Int64
	written atomic.Int64 // bytes of events written
	// eventSize is the length of one event line (resourceVersions of up to 6 digits).
	eventSize int
}

func newStreamingUpstream(t *testing.T) *streamingUpstream {
	t.Helper()
	u := &streamingUpstream{}
	pad := strings.Repeat("x", 32<<10)
	const event = `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"c%d","namespace":"d","resourceVersion":"%d"},"data":{"k":%q}}}` + "\n"
	u.eventSize = len(fmt.Sprintf(event, 10000, 10000, pad))
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") == "" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}`)
			return
		}
		u.open.Add(1)
		defer u.open.Add(-1)
		w.Header().Set("Content-Type", "application/json")
		rc := http.NewResponseController(w)
		var buf []byte
		for rv := 2; r.Context().Err() == nil; rv++ {
			buf = fmt.Appendf(buf[:0], event, rv, rv, pad)
			n, err := w.Write(buf)
			u.written.Add(int64(n))
			if err != nil {
				return
			}
			if rv%16 == 0 {
				_ = rc.Flush()
			}
		}
	}))
	u.EnableHTTP2 = true
	u.StartTLS()
	t.Cleanup(u.Close)
	return u
}

// TestAttackNonReadingWatches: 100 watches whose clients never read, against an upstream
// streaming as fast as it can, grew watchsan by 431 MiB in 25 s (300: 1.33 GB): the upstream
// transport kept Go's default HTTP/2 receive windows, 4 MiB per stream and 1 GiB per
// connection, and each stalled watch's window filled. With --upstream-http2-stream-window
// (256 KiB, kube-apiserver's own) what a stalled watch holds from its upstream is bounded.
// Worse, the watchdog, which counted only upstream reads, took the time a watch spent blocked
// on its client for upstream silence: after --watch-stall-timeout it logged "upstream watch
// silent", counted a stall, reported a failure against an upstream streaming at full speed and
// resumed the watch, for a client that still did not read. Now a client write that blocks for
// --watch-write-timeout ends the watch (its upstream watch closed), counted as a slow client,
// and the time spent writing to a client is nobody's silence: the stall timeout here is
// shorter than the write timeout, and no stall may be counted.
func TestAttackNonReadingWatches(t *testing.T) {
	const watches = 100
	window := 25 * time.Second
	if testing.Short() {
		t.Skip("25 s of streaming")
	}
	up := newStreamingUpstream(t)
	p := startProxy(t, "--upstream="+up.URL, "--upstream-ca-file="+writeCA(t, up.Certificate().Raw), "--no-credentials", "--log-level=info",
		"--watch-stall-timeout=2s", "--watch-write-timeout=5s")
	addr := strings.TrimPrefix(p.URL, "http://")
	pid := p.cmd.Process.Pid
	rss0, err := procRSSMB(pid)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i := 0; i < watches; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.(*net.TCPConn).SetReadBuffer(4 << 10) // the kernel holds little for the client
		// Each of its own selector, as 100 different clients: watches of one scope that fall
		// behind each other would be moved as lagging, which frees what they held.
		if _, err := fmt.Fprintf(c, "GET /api/v1/namespaces/d/configmaps?watch=true&resourceVersion=1&labelSelector=w%%3D%d HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", i); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "100 upstream watches open", func() bool { return up.open.Load() == watches })
	var rss1 float64
	for time.Since(start) < window { // the growth over the window is what is measured
		time.Sleep(time.Second)
		if rss1, err = procRSSMB(pid); err != nil {
			t.Fatal(err)
		}
	}
	// What watchsan holds of the upstream's data is what the upstream wrote less what
	// watchsan passed on to its clients (their connections' kernel buffers hold that).
	delivered := p.Metric("watchsan_watch_events_total", map[string]string{"action": "passed"}) * float64(up.eventSize)
	held := (float64(up.written.Load()) - delivered) / (1 << 20)
	t.Logf("harden: %d non-reading watches over %v: watchsan holds %.0f MiB of the upstream's data; RSS grew %.0f MiB (%.0f -> %.0f MiB)",
		watches, window, held, rss1-rss0, rss0, rss1)
	// 100 stream windows of 256 KiB are 25 MiB; Go's default windows of 4 MiB held 400 MiB.
	if held > 60 {
		t.Errorf("watchsan holds %.0f MiB of upstream data for %d watches that do not read: it is buffered without bound", held, watches)
	}
	// Each watch ends once its client's connection is full (up to 4 MiB of watchsan's socket
	// buffer, at the pace watchsan streams: slower under -race on a busy machine) and then
	// --watch-write-timeout has passed: its upstream watch closed, its client's connection
	// closed by watchsan (the client still holds it; what it got is a cut chunked stream).
	slow := func() float64 { return p.Metric("watchsan_watch_slow_clients_total", nil) }
	conns := func() float64 { return p.Metric("watchsan_connections", map[string]string{"listener": "main"}) }
	if !testutil.UntilEvery(2*time.Minute, 500*time.Millisecond, func() bool { return slow() == watches && up.open.Load() == 0 && conns() == 0 }) {
		t.Errorf("%v after their clients stopped reading, with --watch-write-timeout=5s: %v slow clients counted (want %d), %d upstream watches and %v client connections still open (want none)",
			time.Since(start), slow(), watches, up.open.Load(), conns())
	}
	ended := time.Since(start)
	stalls := p.Metric("watchsan_watch_stalls_total", nil)
	blamed := p.Metric("watchsan_upstream_watch_resumes_total", map[string]string{"reason": "stall"}) +
		p.Metric("watchsan_upstream_watch_moves_total", map[string]string{"reason": "lagging"})
	silentLogs := strings.Count(p.Log(), "upstream watch silent")
	t.Logf("harden: after %v: %v slow clients counted; %d upstream watches and %v client connections open; stalls counted %v, stall resumes and lag moves against the upstream %v, \"upstream watch silent\" logged %d times",
		ended.Round(time.Second), slow(), up.open.Load(), conns(), stalls, blamed, silentLogs)
	if stalls != 0 || blamed != 0 || silentLogs != 0 {
		t.Errorf("watches blocked on their clients blamed the upstream: %v stalls counted, %v stall resumes and lag moves, %d \"upstream watch silent\" lines", stalls, blamed, silentLogs)
	}
	if n := p.Metric("watchsan_watch_stream_ends_total", map[string]string{"reason": "slow-client"}); n != watches {
		t.Errorf("watchsan_watch_stream_ends_total{reason=slow-client} = %v, want %d", n, watches)
	}
	if up := p.Metric("watchsan_upstream_up", nil); up != 1 {
		t.Errorf("watchsan_upstream_up = %v: the upstream was judged for its clients' slowness", up)
	}
}

// slowloris holds n connections from source (a loopback address of its own) that send a
// request's headers one line a second and never finish them; a connection that is closed is
// opened again at once, as an attacker would. It stops when stop is closed.
func slowloris(t *testing.T, addr, source string, n int, stop <-chan struct{}) *atomic.Int64 {
	t.Helper()
	open := &atomic.Int64{}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: 5 * time.Second}
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := d.Dial("tcp", addr)
				if err != nil {
					select {
					case <-stop:
						return
					case <-time.After(100 * time.Millisecond):
					}
					continue
				}
				open.Add(1)
				_, err = io.WriteString(c, "GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\n")
				for err == nil {
					select {
					case <-stop:
						err = errors.New("stopped")
					case <-time.After(time.Second):
						_, err = io.WriteString(c, "X-Slow: 1\r\n")
					}
				}
				open.Add(-1)
				c.Close()
			}
		}()
	}
	t.Cleanup(wg.Wait)
	return open
}

// TestAttackSlowloris: 1,000 connections sending their headers slowly filled
// --max-connections for the 30 s header timeout, and legitimate clients waited in the
// backlog behind them (frontend mode). Per-source limits on connections and on connections
// still sending headers now keep one source from holding them all: a request from another
// source is answered at once while the slow connections keep coming.
func TestAttackSlowloris(t *testing.T) {
	if testing.Short() {
		t.Skip("holds 1,000 connections for half a minute")
	}
	up := newTLSUpstream(t, nil)
	// The frontend-mode defaults (this listener is on loopback, where they are off: there every
	// client is this machine), given explicitly.
	p := startProxy(t, "--upstream="+up.URL, "--upstream-ca-file="+writeCA(t, up.Certificate().Raw), "--no-credentials",
		"--log-level=info", "--max-connections-per-source=100", "--max-header-connections-per-source=32")
	addr := strings.TrimPrefix(p.URL, "http://")
	stop := make(chan struct{})
	defer close(stop)
	held := slowloris(t, addr, "127.0.0.2", 1000, stop)
	eventually(t, 30*time.Second, "the slow connections to be dialled", func() bool {
		return p.Metric("watchsan_connections", map[string]string{"listener": "main"}) >= 32
	})
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var worst time.Duration
	var lat []time.Duration
	for i := 0; i < 20; i++ {
		start := time.Now()
		resp, err := client.Get(p.URL + "/version")
		d := time.Since(start)
		if err != nil {
			t.Fatalf("a legitimate request during the slowloris: %v after %v", err, d)
		}
		resp.Body.Close()
		lat = append(lat, d)
		worst = max(worst, d)
		time.Sleep(time.Second)
	}
	slices.Sort(lat)
	t.Logf("harden: legitimate request latency during %d slow-header connections (the attacker's view: %d open; watchsan's: %v open, %v shed): median %v, worst %v",
		1000, held.Load(), p.Metric("watchsan_connections", map[string]string{"listener": "main"}), p.Metric("watchsan_connections_shed_total", nil),
		lat[len(lat)/2].Round(time.Millisecond), worst.Round(time.Millisecond))
	if worst > 5*time.Second {
		t.Fatalf("a legitimate request waited %v behind the slow connections", worst)
	}
}

// writeCA writes a DER certificate as a PEM CA file.
func writeCA(t *testing.T, der []byte) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(f, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestAttackConfigList: reject-paths given as a two-item YAML list in --config (exec, attach)
// kept only its last item: exec answered 200 with the lent identity, attach 403. Both are now
// refused; a list for a flag that takes one value, a file that is not YAML and a key given
// twice are configuration problems: exit 2, naming the key.
func TestAttackConfigList(t *testing.T) {
	up := newTLSUpstream(t, nil)
	kc := up.kubeconfig(t, "", "lent-token", "", "")
	dir := t.TempDir()
	conf := filepath.Join(dir, "watchsan.yaml")
	if err := os.WriteFile(conf, []byte("reject-paths:\n  - ^/api/.*/pods/.*/exec\n  - ^/api/.*/pods/.*/attach\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, "--kubeconfig="+kc, "--config="+conf)
	addr := strings.TrimPrefix(p.URL, "http://")
	var outcome []string
	for _, sub := range []string{"exec", "attach"} {
		code, body := rawHTTP(t, addr, "POST /api/v1/namespaces/default/pods/p/"+sub+"?command=sh HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n")
		seen := up.take()
		outcome = append(outcome, fmt.Sprintf("%s %d (%d upstream)", sub, code, len(seen)))
		if code != 403 || len(seen) != 0 {
			t.Errorf("%s with the file's reject-paths list: %d %s, %d requests upstream (%+v); want 403 and none", sub, code, body, len(seen), seen)
		}
	}
	t.Logf("harden: reject-paths as a YAML list [exec, attach]: %s", strings.Join(outcome, ", "))
	for name, tc := range map[string]struct{ file, want string }{
		"list for a single value": {"listen: [127.0.0.1:0, 127.0.0.1:1]\n", `key "listen"`},
		"binary":                  {"\x7fELF\x02\x01\x01\x00\x00\x00", "not YAML"},
		"comment only but binary": {"#\xff\xfe", "not YAML"},
		"duplicate key":           {"reject-paths: \"\"\nreject-paths: ^/api/.*/pods/.*/exec\n", `key "reject-paths" given twice`},
	} {
		if err := os.WriteFile(conf, []byte(tc.file), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(ctxT(t, 20*time.Second), watchsanBin, "--kubeconfig="+kc, "--config="+conf, "--listen=127.0.0.1:0", "--admin-listen=127.0.0.1:0")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%s: exit %v, want 2 with %q:\n%s", name, err, tc.want, stderr.String())
		}
	}
}

// TestAttackPassThroughBodyTruncated: 2,000 keep-alive POSTs with a small body, answered by
// the upstream without reading the body (as an apiserver answers 401, 403 or 429; this one
// over HTTP/1.1 and at once, as an nginx in front may): about a third
// came back with their headers and Content-Length and no body, the connection closed. The
// HTTP/1 server reads the rest of a request's body and closes it as the response starts
// (golang/go#40747), while the upstream transport is still reading it: the transport's next
// read fails ("invalid Read on closed Body"), which closes the upstream connection and cuts
// the response. Pass-through requests with a body are now served full duplex.
func TestAttackPassThroughBodyTruncated(t *testing.T) {
	const requests = 2000
	status := []byte(`{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"` + strings.Repeat("forbidden ", 40) + `","reason":"Forbidden","code":403}`)
	up := newEarlyUpstream(t, status)
	p := startProxy(t, "--upstream="+up.url, "--upstream-ca-file="+writeCA(t, up.cert), "--no-credentials", "--log-level=info")
	eventually(t, 20*time.Second, "watchsan ready", func() bool { return readyz(p) == 200 })
	// Keep-alive clients that send a request's headers, then its small body a moment later,
	// in two parts, as a client streaming a body over a real network does.
	body := strings.Repeat("x", 512)
	head := fmt.Sprintf("POST /api/v1/namespaces/d/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	addr := strings.TrimPrefix(p.URL, "http://")
	var truncated, failed atomic.Int64
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var c net.Conn
			var br *bufio.Reader
			defer func() {
				if c != nil {
					c.Close()
				}
			}()
			for next.Add(1) <= requests {
				if c == nil {
					var err error
					if c, err = net.Dial("tcp", addr); err != nil {
						failed.Add(1)
						continue
					}
					br = bufio.NewReader(c)
				}
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				_, err := io.WriteString(c, head)
				for part := 0; part < 2 && err == nil; part++ { // in two parts, as over a real network
					time.Sleep(time.Millisecond)
					_, err = io.WriteString(c, body[part*len(body)/2:(part+1)*len(body)/2])
				}
				var resp *http.Response
				if err == nil {
					resp, err = http.ReadResponse(br, nil)
				}
				if err != nil {
					failed.Add(1)
					c.Close()
					c = nil
					continue
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || len(got) != len(status) || resp.StatusCode != http.StatusForbidden {
					truncated.Add(1)
				}
				if err != nil || resp.Close {
					c.Close()
					c = nil
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("harden: %d keep-alive POSTs answered without their body read: %d truncated, %d failed", requests, truncated.Load(), failed.Load())
	if truncated.Load()+failed.Load() != 0 {
		t.Fatalf("%d of %d responses truncated and %d failed", truncated.Load(), requests, failed.Load())
	}
	if strings.Contains(p.Log(), "panic") {
		t.Fatalf("watchsan panicked:\n%s", p.Log())
	}
}

// earlyUpstream speaks HTTP/1.1 over TLS and answers every request as soon as its headers are
// in, before reading its body (then reads and drops the body, keeping the connection), as a
// server answering 401, 403 or 429 may: /readyz with 200, anything else with 403 and status,
// its headers sent 5 ms before its body.
type earlyUpstream struct {
	url  string
	cert []byte
}

func newEarlyUpstream(t *testing.T, status []byte) *earlyUpstream {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil) // for its certificate
	srv.StartTLS()
	cert := srv.TLS.Certificates[0]
	der := srv.Certificate().Raw
	srv.Close()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br, bw := bufio.NewReader(c), bufio.NewWriter(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					if strings.HasSuffix(req.URL.Path, "/readyz") {
						_, _ = io.WriteString(bw, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
					} else {
						fmt.Fprintf(bw, "HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(status))
						_ = bw.Flush()
						time.Sleep(5 * time.Millisecond)
						_, _ = bw.Write(status)
					}
					if bw.Flush() != nil {
						return
					}
					if _, err := io.Copy(io.Discard, req.Body); err != nil {
						return
					}
				}
			}()
		}
	}()
	return &earlyUpstream{url: "https://" + ln.Addr().String(), cert: der}
}

// TestAttackSIGHUPDuringShutdown: SIGHUP after SIGTERM killed watchsan at once (exit 129, the
// open watch cut mid-stream): the reloader stopped catching SIGHUP when shutdown began. It is
// now logged and ignored; shutdown finishes as it would: exit 0, the watch ended cleanly.
func TestAttackSIGHUPDuringShutdown(t *testing.T) {
	up := newTLSUpstreamWatch(t)
	p := startProxy(t, "--upstream="+up.URL, "--upstream-ca-file="+writeCA(t, up.Certificate().Raw), "--no-credentials",
		"--shutdown-delay=2s", "--log-level=info")
	resp, err := http.Get(p.URL + "/api/v1/namespaces/d/configmaps?watch=true&resourceVersion=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	var ev struct{ Type string }
	if err := dec.Decode(&ev); err != nil || ev.Type != "ADDED" {
		t.Fatalf("the watch's first event: %+v %v", ev, err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "shutdown to begin", func() bool { return strings.Contains(p.Log(), "shutting down") })
	time.Sleep(500 * time.Millisecond) // well into the 2 s shutdown delay: when the SIGHUP comes is the test
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	var end error
	for end == nil {
		var e map[string]any
		end = dec.Decode(&e)
	}
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("watchsan did not exit")
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(p.exitErr, &ee) {
		code = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
	}
	t.Logf("harden: SIGHUP during shutdown: exit %d, the watch ended with %v", code, end)
	if code != 0 || end != io.EOF {
		t.Fatalf("SIGHUP during shutdown: exit %d (%v), watch ended with %v; want 0 and a clean end of stream", code, p.exitErr, end)
	}
	if !strings.Contains(p.Log(), "SIGHUP during shutdown: ignored") {
		t.Fatal("the ignored SIGHUP was not logged")
	}
}

// newTLSUpstreamWatch answers a watch with one ADDED event and holds it open until the watch
// ends (over TLS with HTTP/2, as an apiserver); anything else with {}.
func newTLSUpstreamWatch(t *testing.T) *httptest.Server {
	t.Helper()
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") == "" {
			_, _ = io.WriteString(w, "{}")
			return
		}
		_, _ = io.WriteString(w, `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","namespace":"d","resourceVersion":"2"}}}`+"\n")
		_ = http.NewResponseController(w).Flush()
		<-r.Context().Done()
	}))
	up.EnableHTTP2 = true
	up.StartTLS()
	t.Cleanup(up.Close)
	return up
}

// TestAttackOtherOriginOnLoopback: `Origin: http://localhost:3000` (a dev server, a local web
// UI with an XSS hole) counted as this machine's, so such a page got 200 with the lent
// identity, over WebSocket too; the admin listener on loopback answered any Host, so a
// DNS-rebinding page read /metrics. Same origin now means this listener's scheme and port, and
// the admin listener on loopback applies --accept-hosts.
func TestAttackOtherOriginOnLoopback(t *testing.T) {
	up := newTLSUpstream(t, nil)
	kc := up.kubeconfig(t, "", "lent-token", "", "")
	p := startProxy(t, "--kubeconfig="+kc)
	addr := strings.TrimPrefix(p.URL, "http://")
	secrets := "GET /api/v1/namespaces/default/secrets?watch=true HTTP/1.1\r\nHost: localhost\r\n"
	for _, origin := range []string{"http://localhost:3000", "http://127.0.0.1", "https://" + addr} {
		code, body := rawHTTP(t, addr, secrets+"Origin: "+origin+"\r\n\r\n")
		if seen := up.take(); code != 403 || len(seen) != 0 {
			t.Errorf("Origin %s: %d %s, %d requests upstream; want 403 and none", origin, code, body, len(seen))
		}
	}
	if code, body := rawHTTP(t, addr, "GET /version HTTP/1.1\r\nHost: localhost\r\nOrigin: http://"+addr+"\r\n\r\n"); code != 200 {
		t.Errorf("the listener's own origin: %d %s", code, body)
	}
	adminAddr := strings.TrimPrefix(p.AdminURL, "http://")
	if code, body := rawHTTP(t, adminAddr, "GET /metrics HTTP/1.1\r\nHost: rebound.example:9091\r\n\r\n"); code != 403 || strings.Contains(string(body), "watchsan_") {
		t.Errorf("admin /metrics for a rebound Host: %d, %d bytes", code, len(body))
	}
	if code, _ := rawHTTP(t, adminAddr, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); code != 200 {
		t.Errorf("admin /metrics for 127.0.0.1: %d", code)
	}
}

// TestAttackDeleteMemoryAcrossIdentities: the delete memory's scope hashed only the
// Authorization header, so every client with a certificate (and every lent or anonymous one)
// shared one. alice's watch had a regressed DELETED rewritten, which was remembered; bob,
// watching from the resourceVersion she got, never saw the DELETED: the memory dropped it as
// one he already had. The scope is now who the upstream takes a watch for (the asserted
// certificate identity here, else the lent identity or the token): bob gets the delete, and
// alice's own re-watch still has it dropped (the memory works).
func TestAttackDeleteMemoryAcrossIdentities(t *testing.T) {
	dir := t.TempDir()
	servingCA, err := cluster.NewCA(dir, "serving-ca")
	if err != nil {
		t.Fatal(err)
	}
	clientCA, err := cluster.NewCA(dir, "client-ca")
	if err != nil {
		t.Fatal(err)
	}
	servingCrt, servingKey, err := servingCA.IssueServing("watchsan")
	if err != nil {
		t.Fatal(err)
	}
	// An apiserver with the 1.7 bug: a delete carries the object's previous resourceVersion.
	var mu sync.Mutex
	var asked []string // who asked for a watch from where, as the upstream saw it
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") == "" {
			_, _ = io.WriteString(w, "{}")
			return
		}
		rv := r.URL.Query().Get("resourceVersion")
		mu.Lock()
		asked = append(asked, r.Header.Get("Impersonate-User")+"@"+rv)
		mu.Unlock()
		ev := func(typ, name, rv string) string {
			return fmt.Sprintf(`{"type":%q,"object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":%q,"namespace":"d","uid":"u-%s","resourceVersion":%q}}}`+"\n", typ, name, name, rv)
		}
		switch rv {
		case "5":
			_, _ = io.WriteString(w, ev("ADDED", "a", "10")+ev("ADDED", "b", "11")+ev("DELETED", "a", "10")) // really at 12
		case "12":
			_, _ = io.WriteString(w, ev("DELETED", "a", "10")+ev("ADDED", "c", "14")) // the delete again, after 12
		}
		_ = http.NewResponseController(w).Flush()
		<-r.Context().Done()
	}))
	up.EnableHTTP2 = true
	up.StartTLS()
	t.Cleanup(up.Close)
	kc := (&tlsUpstream{Server: up}).kubeconfig(t, "", "watchsan-token", "", "")
	p := startProxy(t, "--kubeconfig="+kc, "--tls-cert-file="+servingCrt, "--tls-private-key-file="+servingKey,
		"--client-ca-file="+clientCA.File, "--identity-forwarding=impersonate", "--log-level=info")
	url := "https://" + strings.TrimPrefix(p.URL, "http://")
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(servingCA.PEM)
	watch := func(user, rv string, n int) string {
		t.Helper()
		crt, key, err := clientCA.IssueClient(user+"-"+rv, user)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := tls.LoadX509KeyPair(crt, key)
		if err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{ForceAttemptHTTP2: true,
			TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}}}}
		defer hc.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", url+"/api/v1/namespaces/d/configmaps?watch=true&resourceVersion="+rv, nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s's watch from %s: %s", user, rv, resp.Status)
		}
		dec := json.NewDecoder(resp.Body)
		var got []string
		for len(got) < n { // the upstream holds the watch open after its events
			var e struct {
				Type   string
				Object struct {
					Metadata struct{ Name, ResourceVersion string }
				}
			}
			if err := dec.Decode(&e); err != nil {
				got = append(got, "(nothing more in 5s)")
				break
			}
			got = append(got, e.Type+" "+e.Object.Metadata.Name+" "+e.Object.Metadata.ResourceVersion)
		}
		return strings.Join(got, ", ")
	}
	if got, want := watch("alice", "5", 3), "ADDED a 10, ADDED b 11, DELETED a 12"; got != want {
		t.Fatalf("alice from 5 saw [%s], want [%s]: the regressed delete rewritten", got, want)
	}
	bob := watch("bob", "12", 2)
	t.Logf("harden: bob, watching from 12 after alice's delete was rewritten to 12, saw [%s]", bob)
	if want := "DELETED a 13, ADDED c 14"; bob != want {
		t.Errorf("bob from 12 saw [%s], want [%s]: alice's remembered delete hid it from bob, who never had it", bob, want)
	}
	if got, want := watch("alice", "12", 1), "ADDED c 14"; got != want {
		t.Errorf("alice from 12 saw [%s], want [%s]: the delete she already has dropped", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"alice@5", "bob@12", "alice@12"}; !slices.Equal(asked, want) {
		t.Errorf("the upstream was asked %v, want %v (each watch once, as its own user)", asked, want)
	}
}

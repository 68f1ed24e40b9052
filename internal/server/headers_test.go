package server

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// rawH2Get sends one GET with the given header fields on a new HTTP/2 connection to addr, as
// a client that ignores the server's SETTINGS_MAX_HEADER_LIST_SIZE does, and says what came
// back: the response's status ("200", "431", ...) or how the connection ended ("goaway",
// "reset", "closed").
func rawH2Get(addr string, fields []hpack.HeaderField) string {
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	if err != nil {
		return "dial: " + err.Error()
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range append([]hpack.HeaderField{{Name: ":method", Value: "GET"}, {Name: ":scheme", Value: "https"},
		{Name: ":authority", Value: addr}, {Name: ":path", Value: "/api/v1/namespaces/default/configmaps"}}, fields...) {
		_ = enc.WriteField(f)
	}
	fr := http2.NewFramer(conn, conn)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	// Written while the answer is read: a server that refuses the request may stop reading it
	// long before its last frame. The reads never write (no SETTINGS ack: Go's server does
	// not wait for one), so that the framer is written by one goroutine only.
	go func() {
		if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
			return
		}
		if fr.WriteSettings() != nil {
			return
		}
		const frag = 16 << 10 // the default SETTINGS_MAX_FRAME_SIZE
		b := block.Bytes()
		first := b[:min(frag, len(b))]
		b = b[len(first):]
		if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: first, EndStream: true, EndHeaders: len(b) == 0}) != nil {
			return
		}
		for len(b) > 0 {
			chunk := b[:min(frag, len(b))]
			b = b[len(chunk):]
			if fr.WriteContinuation(1, len(b) == 0, chunk) != nil {
				return
			}
		}
	}()
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return "closed"
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if f.StreamID == 1 {
				return f.PseudoValue("status")
			}
		case *http2.GoAwayFrame:
			return "goaway"
		case *http2.RSTStreamFrame:
			return "reset"
		}
	}
}

// bigHeaders are header fields of about n bytes in all, in 8 KiB values.
func bigHeaders(n int) []hpack.HeaderField {
	var out []hpack.HeaderField
	for i := 0; n > 0; i++ {
		v := strings.Repeat("v", min(8<<10, n))
		out = append(out, hpack.HeaderField{Name: fmt.Sprintf("x-big-%d", i), Value: v})
		n -= len(v) + 40
	}
	return out
}

// TestAttackBigHeaderList: a request whose header list passes --max-request-header-bytes is
// refused (431, or its connection closed) before it costs anything further, over HTTP/2 and
// HTTP/1.1, while one under it passes. Go's default, 1 MiB, took them.
func TestAttackBigHeaderList(t *testing.T) {
	upOK := quietWatchUpstream(t, nil)
	certFile, keyFile := servingCert(t)
	r := runServer(t, "--upstream="+upOK.URL, "--tls-cert-file="+certFile, "--tls-private-key-file="+keyFile)
	for _, tc := range []struct {
		size int
		want []string
	}{
		{4 << 10, []string{"200"}},
		{60 << 10, []string{"200"}},
		{100 << 10, []string{"431", "goaway", "closed"}},
		{1000 << 10, []string{"431", "goaway", "closed"}},
	} {
		got := rawH2Get(r.main, bigHeaders(tc.size))
		ok := false
		for _, w := range tc.want {
			ok = ok || got == w
		}
		if !ok {
			t.Errorf("HTTP/2 request with %d KiB of headers: %s, want one of %v", tc.size>>10, got, tc.want)
		}
	}
	plain := runServer(t, "--upstream="+upOK.URL)
	for _, tc := range []struct {
		size int
		want int
	}{{4 << 10, 200}, {60 << 10, 200}, {100 << 10, 431}} {
		req, _ := http.NewRequest("GET", "http://"+plain.main+"/api/v1/namespaces/default/configmaps", nil)
		for _, f := range bigHeaders(tc.size) {
			req.Header.Set(f.Name, f.Value)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("HTTP/1.1 request with %d KiB of headers: %s, want %d", tc.size>>10, resp.Status, tc.want)
		}
	}
}

// TestAttackHeaderBudgets: the requests in progress on one connection (then: from one address)
// carry at most the budget of headers; one more gets 429 with Retry-After, an anonymous one
// once half is in use, while a request with credentials is still admitted.
func TestAttackHeaderBudgets(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	up := quietWatchUpstream(t, release)
	certFile, keyFile := servingCert(t)
	tlsFlags := []string{"--upstream=" + up.URL, "--tls-cert-file=" + certFile, "--tls-private-key-file=" + keyFile}
	for _, tc := range []struct {
		name    string
		flags   []string
		reason  string
		oneConn bool
	}{
		{"connection", []string{"--max-header-bytes-per-connection=163840"}, "header_bytes_connection", true},
		{"source", []string{"--max-header-bytes-per-connection=0", "--max-header-bytes-per-source=163840"}, "header_bytes_source", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runServer(t, append(tlsFlags, tc.flags...)...)
			shared := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, ForceAttemptHTTP2: true}
			t.Cleanup(shared.CloseIdleConnections)
			watch := func(token string) (int, string) {
				tr := shared
				if !tc.oneConn {
					tr = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, ForceAttemptHTTP2: true}
					t.Cleanup(tr.CloseIdleConnections)
				}
				req, _ := http.NewRequest("GET", "https://"+r.main+"/api/v1/namespaces/default/configmaps?watch=1", nil)
				for _, f := range bigHeaders(40 << 10) {
					req.Header.Set(f.Name, f.Value)
				}
				if token != "" {
					req.Header.Set("Authorization", "Bearer "+token)
				}
				resp, err := (&http.Client{Transport: tr}).Do(req)
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode != 200 {
					defer resp.Body.Close()
					b, _ := io.ReadAll(resp.Body)
					return resp.StatusCode, resp.Header.Get("Retry-After") + " " + string(b)
				}
				t.Cleanup(func() { resp.Body.Close() })
				return 200, ""
			}
			// About 41 KiB each: budget 160 KiB, 80 KiB for the anonymous.
			for i, step := range []struct {
				token string
				want  int
			}{{"", 200}, {"", 429}, {"t1", 200}, {"t2", 200}, {"t3", 429}} {
				code, body := watch(step.token)
				if code != step.want {
					t.Fatalf("watch %d (token %q): %d %s, want %d", i, step.token, code, body, step.want)
				}
				if code == 429 && (!strings.HasPrefix(body, "1 ") || !strings.Contains(body, `"reason":"TooManyRequests"`)) {
					t.Fatalf("watch %d refused with Retry-After and body %s", i, body)
				}
			}
			if got := testutil.ToFloat64(r.s.Metrics().Refused.WithLabelValues(tc.reason)); got != 2 {
				t.Errorf("watchsan_requests_refused_total{reason=%q} = %v, want 2", tc.reason, got)
			}
		})
	}
}

// TestBigHeaderListsMemory is the audit's case: 400 anonymous HTTP/2 requests with header
// lists just under 1 MiB, 4 at a time; it reports how much the heap grew (this process's
// peak in use over its start, the client's share included), with the limits as they are and
// with Go's 1 MiB and no budgets, as before them.
func TestBigHeaderListsMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("400 requests of 1 MiB")
	}
	up := quietWatchUpstream(t, nil)
	certFile, keyFile := servingCert(t)
	fields := bigHeaders(1<<20 - 8<<10)
	const requests = 400
	peak := func(args ...string) (grew, allocated uint64, outcomes map[string]int) {
		r := runServer(t, append([]string{"--upstream=" + up.URL, "--no-credentials", "--tls-cert-file=" + certFile, "--tls-private-key-file=" + keyFile}, args...)...)
		defer r.stop()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		base, alloc0 := ms.HeapInuse, ms.TotalAlloc
		var top atomic.Uint64
		done := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > top.Load() {
					top.Store(ms.HeapInuse)
				}
				select {
				case <-done:
					return
				case <-tick.C:
				}
			}
		}()
		var mu sync.Mutex
		outcomes = map[string]int{}
		next := make(chan struct{}, requests)
		for i := 0; i < requests; i++ {
			next <- struct{}{}
		}
		close(next)
		var wg sync.WaitGroup
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range next {
					o := rawH2Get(r.main, fields)
					mu.Lock()
					outcomes[o]++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		close(done)
		<-sampled
		runtime.ReadMemStats(&ms)
		return top.Load() - min(base, top.Load()), ms.TotalAlloc - alloc0, outcomes
	}
	before, beforeAlloc, beforeOut := peak("--max-request-header-bytes=1048576", "--max-header-bytes-per-connection=0", "--max-header-bytes-per-source=-1")
	after, afterAlloc, afterOut := peak()
	t.Logf("%d requests: with 1 MiB and no budgets, the heap in use grew by %d MiB at its peak, %d MiB allocated (outcomes %v); with the defaults %d MiB, %d MiB allocated (outcomes %v); the client's own encoding is in both",
		requests, before>>20, beforeAlloc>>20, beforeOut, after>>20, afterAlloc>>20, afterOut)
	if afterOut["200"] != 0 {
		t.Errorf("with the defaults, %d requests with 1 MiB of headers were served", afterOut["200"])
	}
	// What the server takes of each request is what differs: its decoding of the list, the
	// request it builds and what it sends upstream (the peak in use depends on when the
	// collector ran, so it is reported, not held to).
	if afterAlloc*2 > beforeAlloc {
		t.Errorf("%d MiB allocated with the defaults, not under half the %d MiB before", afterAlloc>>20, beforeAlloc>>20)
	}
}

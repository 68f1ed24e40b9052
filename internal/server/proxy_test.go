package server

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestFullDuplexPassThrough: an HTTP/1 client that reads the answer to a request with a body
// before it sends the body (the upstream answered without it, as an apiserver answers 401,
// 403 or 429) gets the answer at once, whole: the HTTP/1 server would otherwise read the body
// first as the response starts (golang/go#40747), or cut the upstream request under the
// transport still reading it. The client then sends the body, and its connection serves the
// next request: the transport's read of the late body ended before the handler did. The
// client sends a token, as a client answered 403 is an authenticated one.
func TestFullDuplexPassThrough(t *testing.T) {
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden) // the body is not read
		_, _ = io.WriteString(w, `{"kind":"Status","code":403}`)
	}))
	up.EnableHTTP2 = true
	up.StartTLS()
	t.Cleanup(up.Close)
	s, _ := newTestServerArgs(t, "--upstream="+up.URL, "--insecure-skip-tls-verify")
	front := httptest.NewServer(s.Handler())
	t.Cleanup(front.Close)
	c, err := net.Dial("tcp", strings.TrimPrefix(front.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for i := 0; i < 2; i++ {
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := io.WriteString(c, "POST /api/v1/namespaces/d/configmaps HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\nContent-Length: 10\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: no answer before the body was sent: %v", i, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusForbidden || string(body) != `{"kind":"Status","code":403}` {
			t.Fatalf("request %d: %s %q %v", i, resp.Status, body, err)
		}
		time.Sleep(50 * time.Millisecond) // the body comes late: the handler waits for its read
		if _, err := io.WriteString(c, "0123456789"); err != nil {
			t.Fatal(err)
		}
	}
}

// An HTTP/1 request whose body no upstream read (none could be reached: the answer is
// watchsan's own 503) leaves its connection serving the next request. Full duplex lets the
// handler return with the body unread; the server's discard of it after the handler then hit
// the body's end, started a background read, and its read of the next request panicked
// ("invalid concurrent Body.Read call": seen in TestFrozenAPIServerRequestsAnswered).
func TestUnreadBodyLeavesTheConnectionUsable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "https://" + ln.Addr().String()
	ln.Close() // refused from now on
	s, _ := newTestServerArgs(t, "--upstream="+dead, "--insecure-skip-tls-verify", "--retry-budget=0")
	front := httptest.NewServer(s.Handler())
	t.Cleanup(front.Close)
	c, err := net.Dial("tcp", strings.TrimPrefix(front.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	for i := 0; i < 3; i++ {
		if _, err := io.WriteString(c, "POST /api/v1/namespaces/d/configmaps HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d on the connection: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("request %d: %s, want 503", i, resp.Status)
		}
	}
}

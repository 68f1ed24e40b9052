package server

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/watchsan/watchsan/internal/config"
	wtestutil "github.com/watchsan/watchsan/internal/testutil"
)

// limitedServer serves "ok" behind a sourceLimiter with the given limits.
func limitedServer(t *testing.T, maxConns, maxHeaders int) (addr string, shed func() map[string]int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	counts := map[string]int{}
	l := newSourceLimiter(ln, maxConns, maxHeaders, func(r string) { mu.Lock(); counts[r]++; mu.Unlock() })
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			headersDone(r)
			_, _ = io.WriteString(w, "ok")
		}),
		ConnState: l.connState, ConnContext: sourceConnContext,
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]int{}
		for k, v := range counts {
			out[k] = v
		}
		return out
	}
}

func dialFrom(t *testing.T, source, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server closed c (a read ends with EOF or a reset).
func closedByServer(c net.Conn, within time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(within))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

func get(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	_ = c.SetDeadline(time.Time{})
}

// TestAttackSlowlorisPerSource: a source that opens connections and sends its headers slowly
// keeps at most the header limit of them (its oldest is closed for each new one), and at most
// the connection limit in all; another source is not touched; a connection that sent its
// request is no longer counted as sending headers until it starts the next one.
func TestAttackSlowlorisPerSource(t *testing.T) {
	addr, shed := limitedServer(t, 6, 3)
	var slow []net.Conn
	for i := 0; i < 4; i++ {
		c := dialFrom(t, "127.0.0.2", addr)
		_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n") // never finished
		slow = append(slow, c)
	}
	if !closedByServer(slow[0], 5*time.Second) {
		t.Fatal("the oldest of 4 connections sending headers, with a limit of 3, is still open")
	}
	for _, c := range slow[1:] {
		if closedByServer(c, 100*time.Millisecond) {
			t.Fatal("a connection within the header limit was closed")
		}
	}
	// Another source, even while this one is at its limit, is served; so is a client of this
	// source that sends its headers at once: for it, the oldest slow connection goes.
	get(t, dialFrom(t, "127.0.0.3", addr))
	get(t, dialFrom(t, "127.0.0.2", addr))
	if !closedByServer(slow[1], 5*time.Second) {
		t.Fatal("a prompt request from a source at its header limit did not close the oldest slow connection")
	}

	// Connections that sent their request count toward the connection limit only: 2 sending
	// plus 4 served is 6, the limit; the seventh is closed at once.
	for i := 0; i < 3; i++ {
		get(t, dialFrom(t, "127.0.0.2", addr))
	}
	seventh := dialFrom(t, "127.0.0.2", addr)
	if !closedByServer(seventh, 5*time.Second) {
		t.Fatal("a seventh connection of a source limited to 6 is open")
	}
	for _, c := range slow[2:] {
		if closedByServer(c, 100*time.Millisecond) {
			t.Fatal("a connection within both limits was closed")
		}
	}
	wtestutil.Eventually(t, 5*time.Second, "both sheds counted", func() bool {
		s := shed()
		return s["source_headers"] == 2 && s["source_connections"] == 1
	})

	// A served connection that starts its next request slowly is sending headers again: with
	// 3 slow ones already, the oldest of those goes.
	addr2, _ := limitedServer(t, 0, 3)
	kept := dialFrom(t, "127.0.0.2", addr2)
	get(t, kept)
	var slow2 []net.Conn
	for i := 0; i < 3; i++ {
		c := dialFrom(t, "127.0.0.2", addr2)
		_, _ = io.WriteString(c, "GET / HTTP/1.1\r\n")
		slow2 = append(slow2, c)
	}
	if closedByServer(kept, 200*time.Millisecond) {
		t.Fatal("an idle keep-alive connection counted as sending headers")
	}
	_, _ = io.WriteString(kept, "GET / HTTP/1.1\r\n")
	if !closedByServer(slow2[0], 5*time.Second) {
		t.Fatal("the next request's headers on a kept connection did not count")
	}
}

func TestSourceKey(t *testing.T) {
	for addr, want := range map[string]string{
		"10.1.2.3:5000":              "10.1.2.3",
		"[::ffff:10.1.2.3]:5000":     "10.1.2.3",
		"[2001:db8:1:2:3:4:5:6]:443": "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1]:443": "2001:db8:1:2::/64",
		"[2001:db8:1:3::1]:443":      "2001:db8:1:3::/64",
	} {
		a, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := sourceKey(a); got != want {
			t.Errorf("%s: %s, want %s", addr, got, want)
		}
	}
}

// The per-source limits are on by default only off loopback.
func TestSourceLimitDefaults(t *testing.T) {
	for _, tc := range []struct {
		args          []string
		conns, header int
	}{
		{nil, 0, 0},
		{[]string{"--listen=10.0.0.1:6443"}, config.DefaultMaxConnectionsPerSource, config.DefaultMaxHeaderConnectionsPerSource},
		{[]string{"--listen=10.0.0.1:6443", "--max-connections-per-source=-1", "--max-header-connections-per-source=5"}, 0, 5},
		{[]string{"--max-connections-per-source=7"}, 7, 0},
	} {
		c, err := config.Load(append([]string{"--upstream=https://127.0.0.1:1", "--no-credentials", "--tls-cert-file=", "--admin-listen=127.0.0.1:0"}, tc.args...))
		if err != nil {
			t.Fatal(err)
		}
		done, err := c.Complete()
		if err != nil {
			t.Fatal(err)
		}
		if done.SourceConnections != tc.conns || done.SourceHeaderConnections != tc.header {
			t.Errorf("%s: %d and %d, want %d and %d", strings.Join(tc.args, " "), done.SourceConnections, done.SourceHeaderConnections, tc.conns, tc.header)
		}
	}
}

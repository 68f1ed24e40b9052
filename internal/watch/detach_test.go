package watch

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/metrics"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/internal/upstream"
)

// byteStream is a body as read so far, by a goroutine of its own.
type byteStream struct {
	mu  sync.Mutex
	b   []byte
	err error // set once the read ended
}

func readStream(r io.Reader) *byteStream {
	s := &byteStream{}
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			s.mu.Lock()
			s.b = append(s.b, buf[:n]...)
			if err != nil {
				s.err = err
			}
			s.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return s
}

func (s *byteStream) get() ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]byte(nil), s.b...), s.err
}

// lines waits until s holds n lines (a JSON watch's events) and returns them.
func (s *byteStream) lines(t *testing.T, what string, n int) []byte {
	t.Helper()
	var b []byte
	testutil.Eventually(t, 30*time.Second, fmt.Sprintf("%s to hold %d events", what, n), func() bool {
		b, _ = s.get()
		return bytes.Count(b, []byte("\n")) >= n
	})
	i := 0
	for k := 0; k < n; k++ {
		i += bytes.IndexByte(b[i:], '\n') + 1
	}
	return b[:i]
}

// ended waits until s's read ended and returns what it read and how it ended.
func (s *byteStream) ended(t *testing.T, what string) ([]byte, error) {
	t.Helper()
	var (
		b   []byte
		err error
	)
	testutil.Eventually(t, 30*time.Second, what+" to end", func() bool {
		b, err = s.get()
		return err != nil
	})
	return b, err
}

// rawWatch sends a watch request of configmaps in d with query to addr on a connection of its
// own, and returns the connection, the response head as sent and the body as sent (chunked).
func rawWatch(t *testing.T, addr, query string) (net.Conn, string, *byteStream) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "GET /api/v1/namespaces/d/configmaps?watch=true&%s HTTP/1.1\r\nHost: watchsan\r\n\r\n", query)
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	var head strings.Builder
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("the response head: %v (so far %q)", err, head.String())
		}
		head.WriteString(line)
		if line == "\r\n" {
			break
		}
	}
	_ = c.SetReadDeadline(time.Time{})
	return c, head.String(), readStream(br)
}

// withoutLines drops the head's lines that start with one of prefixes.
func withoutLines(head string, prefixes ...string) string {
	var out []string
	for _, l := range strings.SplitAfter(head, "\r\n") {
		keep := true
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				keep = false
			}
		}
		if keep {
			out = append(out, l)
		}
	}
	return strings.Join(out, "")
}

// dechunk decodes a chunked body as sent; complete says it ended with the last chunk.
func dechunk(t *testing.T, raw []byte) (body []byte, complete bool) {
	t.Helper()
	body, err := io.ReadAll(httputil.NewChunkedReader(bytes.NewReader(raw)))
	switch err {
	case nil:
		return body, true
	case io.ErrUnexpectedEOF:
		return body, false
	}
	t.Fatalf("the chunked body does not decode: %v (%q)", err, raw)
	return nil, false
}

// attachedHandler serves, from x's memapi, with sharing on and every subscriber kept on its
// handler (Handler.noDetach): what a shared watch was before it detached.
func attachedHandler(t *testing.T, x *shareFixture) *httptest.Server {
	t.Helper()
	done := make(chan struct{})
	h, err := New(Config{Share: true}, Deps{Attempts: x.attempts, Metrics: metrics.New(nil), Memory: fix.NewDeleteMemory(0, 0, nil),
		Logger: zaptest.NewLogger(t), Done: done})
	if err != nil {
		t.Fatal(err)
	}
	waitServed(t, h)
	h.noDetach = true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, cred := reqinfo.Parse(r), upstream.Decide(r.Header, r.TLS, true, upstream.IdentityOff)
		h.Serve(w, r, &info, &cred, "")
	}))
	t.Cleanup(func() { close(done); srv.Close() })
	return srv
}

// A detached shared watch (HTTP/1.1) is sent what a shared watch kept on its handler is, byte
// for byte: the same head but the Connection: close it adds (no handler is left to read a next
// request), the same first events (the ring's backlog at its join) and later ones, decoded by
// net/http's client and as sent on the wire, in chunks that decode.
func TestDetachedSameBytesAsAttached(t *testing.T) {
	x := newShareFixture(t, Config{})
	attached := attachedHandler(t, x)
	from := x.write(t, "before", 3, 10)
	q := "resourceVersion=" + rv(from-2)
	type side struct {
		client, raw *byteStream
		head        string
	}
	open := func(base string) side {
		resp, err := http.Get(base + "/api/v1/namespaces/d/configmaps?watch=true&" + q)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		_, head, raw := rawWatch(t, strings.TrimPrefix(base, "http://"), q)
		return side{client: readStream(resp.Body), raw: raw, head: head}
	}
	det, att := open(x.srv.URL), open(attached.URL)
	testutil.Eventually(t, 10*time.Second, "two detached watches", func() bool { return x.h.DetachedWatches() == 2 })
	if !strings.Contains(det.head, "\r\nConnection: close\r\n") {
		t.Errorf("the detached head says nothing of closing:\n%s", det.head)
	}
	if got, want := withoutLines(det.head, "Date:", "Connection:"), withoutLines(att.head, "Date:"); got != want {
		t.Errorf("the detached head\n%s\nwant the attached one's\n%s", got, want)
	}
	compare := func(n int) {
		t.Helper()
		if got, want := det.client.lines(t, "the detached watch", n), att.client.lines(t, "the attached watch", n); !bytes.Equal(got, want) {
			t.Errorf("the detached watch's first %d events\n%s\nwant\n%s", n, got, want)
		}
		testutil.Eventually(t, 30*time.Second, "both wires to carry the events", func() bool {
			bd, _ := det.raw.get()
			ba, _ := att.raw.get()
			dd, _ := dechunk(t, bd)
			da, _ := dechunk(t, ba)
			return bytes.Count(dd, []byte("\n")) >= n && bytes.Count(da, []byte("\n")) >= n
		})
		bd, _ := det.raw.get()
		ba, _ := att.raw.get()
		dd, _ := dechunk(t, bd)
		da, _ := dechunk(t, ba)
		if !bytes.Equal(dd, da) {
			t.Errorf("the detached wire decodes to\n%s\nwant\n%s", dd, da)
		}
	}
	compare(2) // the backlog
	x.write(t, "after", 3, 100)
	compare(5)
}

// A client that closes its connection frees its detached member: it leaves the feed, the
// open-watches gauge comes down, its end is counted (client-gone) and the Detacher is told
// the body bytes it was sent.
func TestDetachedClientLeaves(t *testing.T) {
	x := newShareFixture(t, Config{})
	from := x.write(t, "before", 1, 10)
	told := make(chan int64, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, cred := reqinfo.Parse(r), upstream.Decide(r.Header, r.TLS, true, upstream.IdentityOff)
		x.h.Serve(&detachRecorder{ResponseWriter: w, told: told}, r, &info, &cred, "")
	}))
	t.Cleanup(srv.Close)
	stay := watchAt(t, x.srv.URL, "resourceVersion="+rv(from), nil, true)
	leave := watchAt(t, srv.URL, "resourceVersion="+rv(from), nil, true)
	x.waitSubscribers(t, 2)
	open := x.m.OpenWatches.WithLabelValues("configmaps")
	testutil.Eventually(t, 10*time.Second, "2 detached and open watches", func() bool {
		return x.h.DetachedWatches() == 2 && promtest.ToFloat64(open) == 2
	})
	x.write(t, "cm", 2, 10)
	got := leave.waitFor(t, "the client that leaves", 2)
	leave.cancel() // closes its connection
	x.waitSubscribers(t, 1)
	testutil.Eventually(t, 10*time.Second, "the member freed", func() bool {
		return x.h.DetachedWatches() == 1 && promtest.ToFloat64(open) == 1 &&
			promtest.ToFloat64(x.m.StreamEnds.WithLabelValues(EndClientGone.String())) == 1
	})
	select {
	case n := <-told:
		if n < int64(len(got))*50 { // two configmaps' events, each well over 50 bytes
			t.Errorf("the Detacher was told %d bytes for %d events", n, len(got))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the Detacher was never told the stream ended")
	}
	x.write(t, "more", 1, 10)
	stay.waitFor(t, "the client that stays", 3)
}

// detachRecorder is a wrapper like the server's access-log recorder: it hears the detach.
type detachRecorder struct {
	http.ResponseWriter
	told chan int64
}

func (d *detachRecorder) Unwrap() http.ResponseWriter { return d.ResponseWriter }
func (d *detachRecorder) Detach() func(int64)         { return func(n int64) { d.told <- n } }

// timeoutSeconds ends a detached watch cleanly, on the Handler's clock: the last chunk, then
// the connection closed; the feed goes on.
func TestDetachedTimeoutEndsWithLastChunk(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	x := newShareFixtureClock(t, Config{}, clk)
	from := x.write(t, "before", 1, 10)
	stay := watchAt(t, x.srv.URL, "resourceVersion="+rv(from), nil, true)
	_, _, raw := rawWatch(t, strings.TrimPrefix(x.srv.URL, "http://"), "timeoutSeconds=30&resourceVersion="+rv(from))
	x.waitSubscribers(t, 2)
	x.write(t, "cm", 1, 10)
	testutil.Eventually(t, 10*time.Second, "the event on the wire", func() bool {
		b, _ := raw.get()
		body, _ := dechunk(t, b)
		return bytes.Contains(body, []byte(`"cm-0"`))
	})
	testutil.Eventually(t, 10*time.Second, "both detached (the timer for timeoutSeconds set)", func() bool { return x.h.DetachedWatches() == 2 })
	clk.Step(31 * time.Second)
	b, err := raw.ended(t, "the watch with timeoutSeconds")
	if err != io.EOF {
		t.Errorf("its connection ended with %v, want EOF (closed)", err)
	}
	if body, complete := dechunk(t, b); !complete || !bytes.HasSuffix(b, []byte("\r\n0\r\n\r\n")) || !bytes.Contains(body, []byte(`"cm-0"`)) {
		t.Errorf("its body does not end with the last chunk after its event: %q", b)
	}
	x.waitSubscribers(t, 1)
	if got := promtest.ToFloat64(x.m.StreamEnds.WithLabelValues(EndDeadline.String())); got != 1 {
		t.Errorf("client-deadline ends %v, want 1", got)
	}
	x.write(t, "more", 1, 10)
	stay.waitFor(t, "the other client", 2)
}

// A detached client that stops reading is ended as a slow client, as on its handler: a write
// to it that does not complete within the write timeout cuts its stream (counted a slow
// client, events), whether its queue filled first (it is off the feed at once then, and ends
// after the write in progress) or not.
func TestDetachedSlowClient(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"write timeout", Config{ShareSubscriberBytes: 256 << 20, WriteTimeout: 500 * time.Millisecond}},
		{"queue full", Config{ShareSubscriberBytes: 1 << 20, WriteTimeout: 2 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newShareFixture(t, tc.cfg)
			from := x.write(t, "before", 1, 10)
			fast := watchAt(t, x.srv.URL, "resourceVersion="+rv(from), nil, true)
			rawWatchUnread(t, strings.TrimPrefix(x.srv.URL, "http://"), "resourceVersion="+rv(from))
			x.waitSubscribers(t, 2)
			// More than the kernel's buffers on both sides hold for the client that does not read.
			const n = 200
			x.write(t, "big", n, 64<<10)
			fast.waitFor(t, "the fast client", n)
			testutil.Eventually(t, 30*time.Second, "the slow subscriber ended (slow-client)", func() bool {
				return promtest.ToFloat64(x.m.StreamEnds.WithLabelValues(EndSlowClient.String())) == 1 &&
					promtest.ToFloat64(x.m.SharedSlowSubscribers) == 1 && x.h.DetachedWatches() == 1
			})
			if got := promtest.ToFloat64(x.m.SlowClients.WithLabelValues(slowEvents)); got != 1 {
				t.Errorf("slow clients (events) %v, want 1", got)
			}
			x.waitSubscribers(t, 1)
			x.write(t, "more", 1, 10)
			fast.waitFor(t, "the fast client", n+1)
		})
	}
}

// rawWatchUnread is rawWatch for a client that reads nothing, with a small receive buffer.
func rawWatchUnread(t *testing.T, addr, query string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10)
	}
	fmt.Fprintf(c, "GET /api/v1/namespaces/d/configmaps?watch=true&%s HTTP/1.1\r\nHost: watchsan\r\n\r\n", query)
}

// At shutdown a detached watch ends with its feed, cleanly (the last chunk, the connection
// closed), and WaitDetached waits for it.
func TestDetachedShutdown(t *testing.T) {
	x := newShareFixture(t, Config{})
	from := x.write(t, "before", 1, 10)
	_, _, raw := rawWatch(t, strings.TrimPrefix(x.srv.URL, "http://"), "resourceVersion="+rv(from))
	x.waitSubscribers(t, 1)
	x.write(t, "cm", 1, 10)
	testutil.Eventually(t, 10*time.Second, "the event on the wire", func() bool {
		b, _ := raw.get()
		body, _ := dechunk(t, b)
		return bytes.Contains(body, []byte(`"cm-0"`))
	})
	x.shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := x.h.WaitDetached(ctx); err != nil {
		t.Fatalf("WaitDetached: %v", err)
	}
	if n := x.h.DetachedWatches(); n != 0 {
		t.Errorf("%d detached watches after WaitDetached", n)
	}
	b, err := raw.ended(t, "the detached watch")
	if _, complete := dechunk(t, b); err != io.EOF || !complete {
		t.Errorf("it ended with %v, its body %q; want the last chunk, then EOF", err, b)
	}
	if got := promtest.ToFloat64(x.m.StreamEnds.WithLabelValues(EndShutdown.String())); got != 1 {
		t.Errorf("shutdown ends %v, want 1", got)
	}
}

// WaitDetached gives up at its context's end and closes what is left: a detached watch whose
// client is gone quiet never holds a shutdown for good.
func TestWaitDetachedBounded(t *testing.T) {
	x := newShareFixture(t, Config{})
	from := x.write(t, "before", 1, 10)
	_, _, raw := rawWatch(t, strings.TrimPrefix(x.srv.URL, "http://"), "resourceVersion="+rv(from))
	testutil.Eventually(t, 10*time.Second, "a detached watch", func() bool { return x.h.DetachedWatches() == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no shutdown: the feed goes on, and the wait ends at once
	if err := x.h.WaitDetached(ctx); err == nil {
		t.Fatal("WaitDetached returned nil with a watch open")
	}
	if _, err := raw.ended(t, "the detached watch"); err != io.EOF {
		t.Errorf("its connection ended with %v, want EOF", err)
	}
	x.waitSubscribers(t, 0)
	// One detached after the wait gave up is ended at once.
	_, _, late := rawWatch(t, strings.TrimPrefix(x.srv.URL, "http://"), "resourceVersion="+rv(from))
	if _, err := late.ended(t, "a watch detached after"); err != io.EOF {
		t.Errorf("its connection ended with %v, want EOF", err)
	}
}

// A client that sends a request after its watch (pipelined) gets no answer to it on this
// connection, which the head said closes: the stream ends at once.
func TestDetachedPipelinedRequestEnds(t *testing.T) {
	x := newShareFixture(t, Config{})
	from := x.write(t, "before", 1, 10)
	c, _, raw := rawWatch(t, strings.TrimPrefix(x.srv.URL, "http://"), "resourceVersion="+rv(from))
	x.waitSubscribers(t, 1)
	fmt.Fprintf(c, "GET /api/v1/namespaces/d/configmaps HTTP/1.1\r\nHost: watchsan\r\n\r\n")
	// Closed with the request unread: a reset, or an EOF if the close came first.
	if _, err := raw.ended(t, "the watch after a pipelined request"); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("its connection ended with %v, want EOF or a reset", err)
	}
	x.waitSubscribers(t, 0)
	if got := promtest.ToFloat64(x.m.StreamEnds.WithLabelValues(EndClientGone.String())); got != 1 {
		t.Errorf("client-gone ends %v, want 1", got)
	}
}

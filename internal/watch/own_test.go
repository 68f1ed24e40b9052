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
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/internal/upstream"
)

// writeCounter counts the Writes made on the connections its listener accepted.
type writeCounter struct {
	net.Listener
	writes atomic.Int64
}

func (l *writeCounter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countedWrites{Conn: c, n: &l.writes}, nil
}

type countedWrites struct {
	net.Conn
	n *atomic.Int64
}

func (c *countedWrites) Write(p []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(p)
}

// servedCounting serves f's Handler on a listener that counts writes, through w's wrapper
// (nil: none); it returns the address.
func servedCounting(t *testing.T, f *fixture, wrap func(http.ResponseWriter) http.ResponseWriter) (string, *writeCounter) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	wc := &writeCounter{Listener: ln}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if wrap != nil {
			w = wrap(w)
		}
		info, cred := reqinfo.Parse(r), upstream.Decide(r.Header, r.TLS, false, upstream.IdentityOff)
		f.h.Serve(w, r, &info, &cred, "")
	}))
	srv.Listener = wc
	srv.Start()
	t.Cleanup(srv.Close)
	return wc.Addr().String(), wc
}

// chunks splits a chunked body as sent into its chunks' sizes; complete: it ended with the
// last chunk.
func chunks(t *testing.T, raw []byte) (sizes []int, complete bool) {
	t.Helper()
	br := bufio.NewReader(bytes.NewReader(raw))
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return sizes, false
		}
		n, err := strconv.ParseUint(strings.TrimSpace(line), 16, 32)
		if err != nil {
			t.Fatalf("chunk size line %q: %v", line, err)
		}
		if n == 0 {
			return sizes, true
		}
		if _, err := br.Discard(int(n) + 2); err != nil {
			return sizes, false
		}
		sizes = append(sizes, int(n))
	}
}

// burst is n events of about 200 bytes each, from resourceVersion 10 on.
func burst(n int) []string {
	evs := make([]string, n)
	for i := range evs {
		evs[i] = obj("ADDED", fmt.Sprintf("cm-%03d", i), strconv.Itoa(10+i))
	}
	return evs
}

// A private watch on HTTP/1.1 takes its connection once the head is out and writes each
// batch as one chunk in one write (docs/design.md section 5): a burst the upstream sends at
// once reaches the client in chunks bigger than net/http's 4 KiB buffer, each of them one
// Write on the connection. Kept on net/http's writer (noOwn), the same chunks take more
// writes than there are chunks: the control that shows the count can tell.
func TestOwnedOneWritePerChunk(t *testing.T) {
	for _, own := range []bool{true, false} {
		t.Run(fmt.Sprintf("owned=%v", own), func(t *testing.T) {
			up := &upstreamScript{}
			evs := burst(300)
			up.steps = []func(http.ResponseWriter, *http.Request){func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(200)
				io.WriteString(w, strings.Join(evs, "")) // one write, bigger than a bufio buffer
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			}}
			f := newFixture(t, Config{}, up)
			f.h.noOwn = !own
			addr, wc := servedCounting(t, f, nil)
			_, head, raw := rawWatch(t, addr, "resourceVersion=5")
			if got := strings.Contains(head, "Connection: close"); got != own {
				t.Errorf("head says Connection: close %v, want %v:\n%s", got, own, head)
			}
			// Every event on the wire, and every chunk whole: net/http writes a chunk's closing
			// CRLF apart, and a chunk without it is not counted (chunks).
			all := len(strings.Join(evs, ""))
			testutil.Eventually(t, 10*time.Second, "every event on the wire in whole chunks", func() bool {
				b, _ := raw.get()
				sizes, _ := chunks(t, b)
				n := 0
				for _, s := range sizes {
					n += s
				}
				return n == all
			})
			b, _ := raw.get()
			body, _ := dechunk(t, b)
			if string(body) != strings.Join(evs, "") {
				t.Fatalf("the body is not the events as sent")
			}
			sizes, _ := chunks(t, b)
			big := 0
			for _, n := range sizes {
				if n > 4<<10 {
					big++
				}
			}
			writes := int(wc.writes.Load()) - 1 // the head's
			t.Logf("owned=%v: %d chunks (%d over 4 KiB) in %d writes", own, len(sizes), big, writes)
			if big == 0 {
				t.Fatalf("no chunk over 4 KiB (%v): the test shows nothing", sizes)
			}
			switch {
			case own && writes != len(sizes):
				t.Errorf("%d chunks took %d writes, want one each", len(sizes), writes)
			case !own && writes <= len(sizes):
				t.Errorf("net/http wrote %d chunks over 4 KiB in %d writes: the control tells nothing", big, writes)
			}
			if own {
				if n := f.h.conns.Len(classOwned); n != 1 {
					t.Errorf("%d owned connections, want 1", n)
				}
			}
		})
	}
}

// A client that leaves an owned watch (closes its connection) ends it at once: the upstream
// watch is closed, the stream counted as client-gone, the open watch uncounted, the bytes
// told to the Detacher (the access log's) and the connection no longer owned.
func TestOwnedClientLeaves(t *testing.T) {
	up := &upstreamScript{canceled: make(chan struct{})}
	up.steps = []func(http.ResponseWriter, *http.Request){thenHang(up, obj("ADDED", "a", "10"), obj("ADDED", "b", "11"))}
	f := newFixture(t, Config{}, up)
	told := make(chan int64, 1)
	addr, _ := servedCounting(t, f, func(w http.ResponseWriter) http.ResponseWriter {
		return &detachRecorder{ResponseWriter: w, told: told}
	})
	c, _, raw := rawWatch(t, addr, "resourceVersion=5")
	onWire(t, raw, 2)
	open := f.m.OpenWatches.WithLabelValues("configmaps")
	if v := promtest.ToFloat64(open); v != 1 {
		t.Fatalf("open watches %v, want 1", v)
	}
	c.Close()
	requireClientGone(t, f, up)
	select {
	case n := <-told:
		if want := int64(len(obj("ADDED", "a", "10")) * 2); n != want {
			t.Errorf("the Detacher was told %d bytes, want %d", n, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the Detacher was never told the stream ended")
	}
	if err := f.h.WaitDetached(ctxT(t, time.Second)); err != nil {
		t.Errorf("WaitDetached: %v with no watch open", err)
	}
}

// ownedWatch is a watch that owns its connection, its first event on the wire, its upstream
// watch open after it.
func ownedWatch(t *testing.T) (*fixture, *byteStream) {
	t.Helper()
	up := &upstreamScript{}
	up.steps = []func(http.ResponseWriter, *http.Request){thenHang(up, obj("ADDED", "a", "10"))}
	f := newFixture(t, Config{}, up)
	addr, _ := servedCounting(t, f, nil)
	_, _, raw := rawWatch(t, addr, "resourceVersion=5")
	onWire(t, raw, 1)
	return f, raw
}

// At shutdown an owned watch ends cleanly: the last chunk, the connection closed, and
// WaitDetached (which the server calls after http.Server.Shutdown, which does not wait for
// hijacked connections) waits for it.
func TestOwnedShutdownEndsWithLastChunk(t *testing.T) {
	f, raw := ownedWatch(t)
	close(f.done)
	if err := f.h.WaitDetached(ctxT(t, 10*time.Second)); err != nil {
		t.Fatalf("WaitDetached: %v", err)
	}
	b, err := raw.ended(t, "the owned watch")
	if err != io.EOF {
		t.Errorf("its connection ended with %v, want EOF", err)
	}
	if _, complete := chunks(t, b); !complete {
		t.Errorf("no last chunk: %q", b)
	}
	if v := promtest.ToFloat64(f.m.StreamEnds.WithLabelValues(EndShutdown.String())); v != 1 {
		t.Errorf("ends{shutdown} = %v, want 1", v)
	}
}

// WaitDetached is bounded for owned watches too: past its context it closes their connections.
func TestWaitOwnedBounded(t *testing.T) {
	f, raw := ownedWatch(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no shutdown: the watch goes on, and the wait ends at once
	if err := f.h.WaitDetached(ctx); err == nil {
		t.Fatal("WaitDetached returned nil with an owned watch open")
	}
	if _, err := raw.ended(t, "the owned watch"); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("its connection ended with %v, want EOF", err)
	}
	testutil.Eventually(t, 10*time.Second, "the watch ended", func() bool {
		return promtest.ToFloat64(f.m.OpenWatches.WithLabelValues("configmaps")) == 0
	})
}

// A client that sends a request after its watch (pipelined) gets no answer to it on this
// connection, which the head said closes: the stream ends at once.
func TestOwnedPipelinedRequestEnds(t *testing.T) {
	up := &upstreamScript{canceled: make(chan struct{})}
	up.steps = []func(http.ResponseWriter, *http.Request){thenHang(up, obj("ADDED", "a", "10"))}
	f := newFixture(t, Config{}, up)
	addr, _ := servedCounting(t, f, nil)
	c, _, raw := rawWatch(t, addr, "resourceVersion=5")
	onWire(t, raw, 1)
	fmt.Fprintf(c, "GET /api/v1/namespaces/d/configmaps HTTP/1.1\r\nHost: watchsan\r\n\r\n")
	if _, err := raw.ended(t, "the watch after a pipelined request"); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("its connection ended with %v, want EOF or a reset", err)
	}
	select {
	case <-up.canceled:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream watch was not closed")
	}
	testutil.Eventually(t, 10*time.Second, "the watch ended as client-gone", func() bool {
		return promtest.ToFloat64(f.m.StreamEnds.WithLabelValues(EndClientGone.String())) == 1
	})
}

// onWire waits until the chunked body raw holds n events.
func onWire(t *testing.T, raw *byteStream, n int) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, fmt.Sprintf("%d events on the wire", n), func() bool {
		b, _ := raw.get()
		body, _ := dechunk(t, b)
		return bytes.Count(body, []byte("\n")) >= n
	})
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// An owned watch outlives its handler (Handler.Serve): once its head is out the handler
// returns, so that net/http lets go of the connection's buffers and the response, and net/http
// cancelling the request's context then does not end the watch: an event the upstream sends
// after it still reaches the client, and the client's leaving still ends the watch.
func TestOwnedWatchOutlivesItsHandler(t *testing.T) {
	more := make(chan struct{})
	up := &upstreamScript{canceled: make(chan struct{})}
	up.steps = []func(http.ResponseWriter, *http.Request){func(w http.ResponseWriter, r *http.Request) {
		send(w, obj("ADDED", "a", "10"))
		select {
		case <-more:
			send(w, obj("ADDED", "b", "11"))
		case <-r.Context().Done():
		}
		thenHang(up)(w, r)
	}}
	f := newFixture(t, Config{}, up)
	returned := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(returned)
		info, cred := reqinfo.Parse(r), upstream.Decide(r.Header, r.TLS, false, upstream.IdentityOff)
		f.h.Serve(w, r, &info, &cred, "")
	}))
	t.Cleanup(srv.Close)
	c, _, raw := rawWatch(t, srv.Listener.Addr().String(), "resourceVersion=5")
	onWire(t, raw, 1)
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler of an owned watch did not return")
	}
	close(more)
	onWire(t, raw, 2)
	if v := promtest.ToFloat64(f.m.OpenWatches.WithLabelValues("configmaps")); v != 1 {
		t.Fatalf("open watches %v after the handler returned, want 1", v)
	}
	c.Close()
	requireClientGone(t, f, up)
}

// requireClientGone waits for the watch's end after its client left: its upstream watch
// closed, the stream counted as client-gone, no watch open.
func requireClientGone(t *testing.T, f *fixture, up *upstreamScript) {
	t.Helper()
	select {
	case <-up.canceled:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream watch was not closed after the client left")
	}
	open := f.m.OpenWatches.WithLabelValues("configmaps")
	testutil.Eventually(t, 10*time.Second, "the watch ended as client-gone", func() bool {
		return promtest.ToFloat64(f.m.StreamEnds.WithLabelValues(EndClientGone.String())) == 1 && promtest.ToFloat64(open) == 0
	})
}

// WaitDetached returns only once an owned watch's end is counted: while the Detacher's end
// (the access log line, the request metrics) has not returned, the watch is still waited for,
// so that the server's Run does not return with a request in flight.
func TestWaitOwnedWaitsForTheCount(t *testing.T) {
	up := &upstreamScript{}
	up.steps = []func(http.ResponseWriter, *http.Request){thenHang(up, obj("ADDED", "a", "10"))}
	f := newFixture(t, Config{}, up)
	bd := &blockingDetacher{entered: make(chan struct{}), release: make(chan struct{})}
	addr, _ := servedCounting(t, f, func(w http.ResponseWriter) http.ResponseWriter {
		bd.ResponseWriter = w
		return bd
	})
	_, _, raw := rawWatch(t, addr, "resourceVersion=5")
	onWire(t, raw, 1)
	close(f.done) // shutdown: the watch ends
	waited := make(chan error, 1)
	go func() { waited <- f.h.WaitDetached(ctxT(t, 20*time.Second)) }()
	select {
	case <-bd.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch's end was never counted")
	}
	select {
	case err := <-waited:
		t.Fatalf("WaitDetached returned (%v) while the watch's end was still being counted", err)
	case <-time.After(time.Second): // bounded: it may not return at all until the release
	}
	close(bd.release)
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("WaitDetached: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitDetached did not return after the count")
	}
}

// blockingDetacher is a Detacher whose end says it was entered and returns only once released.
type blockingDetacher struct {
	http.ResponseWriter
	entered, release chan struct{}
}

func (d *blockingDetacher) Unwrap() http.ResponseWriter { return d.ResponseWriter }
func (d *blockingDetacher) Detach() func(int64) {
	return func(int64) { close(d.entered); <-d.release }
}

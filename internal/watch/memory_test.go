//go:build linux

package watch

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/watchsan/watchsan/internal/chunked"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/internal/upstream"
)

// The audit's case: many HTTP/1.1 subscribers of one busy shared feed that never read. What
// watchsan holds for them, measured as the heap in use after a GC, stays within what the flags
// allow: each subscriber at most --share-subscriber-buffer-bytes (its queue, its entries and
// the frames its writer holds, all counted) plus a small constant (its member, its detached
// writer, its share of the queue's blocks), the feed's ring on top; a subscriber that reads is
// served while they are blocked. Before the bound counted what a subscriber holds, each blocked writer held
// a 64 KiB batch buffer of its own on top of its queue (docs/design.md section 11, "Bounds").
//
// 1000 subscribers; WATCHSAN_MEMORY_SUBSCRIBERS sets another number, -short uses 200.
func TestNonReadingSubscribersMemoryBound(t *testing.T) {
	n := 1000
	if testing.Short() {
		n = 200
	}
	if s := os.Getenv("WATCHSAN_MEMORY_SUBSCRIBERS"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	const (
		subBytes  = 32 << 10  // --share-subscriber-buffer-bytes
		ringBytes = 1 << 20   // --share-ring-bytes
		perSub    = 8 << 10   // the constant each subscriber may cost beyond its bound
		slack     = 16 << 20  // the heap's own noise: the servers, the loggers, the pools' leftovers
		eventSize = 900       // about 1 KiB frames
		writeTO   = time.Hour // the blocked writers stay blocked while measured
	)
	x := newShareFixture(t, Config{ShareSubscriberBytes: subBytes, ShareRingBytes: ringBytes, WriteTimeout: writeTO})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, cred := reqinfo.Parse(r), upstream.Decide(r.Header, r.TLS, true, upstream.IdentityOff)
		x.h.Serve(w, r, &info, &cred, "")
	}))
	srv.Listener = testutil.SmallSendBuffers{Listener: srv.Listener}
	srv.Start()
	// Before the fixture's cleanup (registered first, so run last): shutdown ends the feed,
	// and the blocked writers fail once their connections are closed.
	var conns []net.Conn
	t.Cleanup(func() {
		x.shutdown()
		for _, c := range conns {
			c.Close()
		}
		srv.Close()
	})
	from := x.write(t, "before", 1, 10)

	runtime.GC()
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	addr := strings.TrimPrefix(srv.URL, "http://")
	// Each client's receive buffer is small from its SYN on (set after the connect, the window
	// already offered would take more): its connection fills before its queue does, and its
	// writer blocks.
	dialer := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10) })
	}}
	for i := 0; i < n; i++ {
		c, err := dialer.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := fmt.Fprintf(c, "GET /api/v1/namespaces/d/configmaps?watch=true&resourceVersion=%d HTTP/1.1\r\nHost: x\r\n\r\n", from); err != nil {
			t.Fatal(err)
		}
	}
	// Each has its head (one read of a few bytes, never its body): a subscriber, detached.
	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		line, err := bufio.NewReaderSize(io.LimitReader(c, 12), 16).ReadString(' ')
		if err != nil || line != "HTTP/1.1 " {
			t.Fatalf("client %d: %q %v", i, line, err)
		}
	}
	x.waitSubscribers(t, n)

	// A busy feed: events until every non-reader fell its bound behind and is off the feed,
	// its writer blocked on its full connection.
	written := 0
	if !testutil.Until(60*time.Second, func() bool {
		if promtest.ToFloat64(x.m.SharedSubscribers) == 0 {
			return true
		}
		x.write(t, "busy"+strconv.Itoa(written), 5, eventSize)
		written += 5
		return false
	}) {
		t.Fatalf("after %d events, %v subscribers of %d are still on the feed", written, promtest.ToFloat64(x.m.SharedSubscribers), n)
	}
	// With every writer blocked, a client that reads is served. (Its queue is as small as the
	// others': on a loaded machine it might fall behind their first burst too.)
	at := x.api.ResourceVersion()
	reader := watchAt(t, srv.URL, "resourceVersion="+rv(at), nil, true)
	last := x.write(t, "after", 20, eventSize)
	if !strings.HasSuffix(reader.waitFor(t, "the reading subscriber", 20)[19], " "+rv(last)) {
		t.Fatalf("the reading subscriber's last event is not the last written (%d)", last)
	}

	runtime.GC()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	held := int64(after.HeapInuse) - int64(before.HeapInuse)
	bound := int64(n)*(subBytes+perSub) + ringBytes + slack
	t.Logf("%d non-reading subscribers, %d events of about 1 KiB: heap in use %d -> %d bytes (+%d, %d per subscriber; bound %d), stacks %d -> %d, goroutines %d",
		n, written, before.HeapInuse, after.HeapInuse, held, held/int64(n), bound, before.StackInuse, after.StackInuse, runtime.NumGoroutine())
	// What is measured is blocked writers: most are (a writer whose last write got through ends
	// at once, its member gone).
	if open := x.h.DetachedWatches(); open < n/2 {
		t.Fatalf("only %d of %d non-reading subscribers' writers are blocked: the measure is not theirs", open, n)
	}
	if held > bound {
		t.Fatalf("%d non-reading subscribers hold %d bytes of heap, over the bound %d (%d each beyond their %d)", n, held, bound, held/int64(n)-subBytes, subBytes)
	}
}

// A detached writer whose chunk's write blocks gives its buffer back and writes the rest
// straight from the frames (put): a client that then reads gets every event, whole and in
// order, the chunked body intact.
func TestBlockedWriterResumesFromTheFrames(t *testing.T) {
	x := newShareFixture(t, Config{WriteTimeout: time.Minute})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, cred := reqinfo.Parse(r), upstream.Decide(r.Header, r.TLS, true, upstream.IdentityOff)
		x.h.Serve(w, r, &info, &cred, "")
	}))
	srv.Listener = testutil.SmallSendBuffers{Listener: srv.Listener}
	srv.Start()
	t.Cleanup(func() { x.shutdown(); srv.Close() })
	from := x.write(t, "before", 1, 10)
	dialer := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10) })
	}}
	c, err := dialer.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := fmt.Fprintf(c, "GET /api/v1/namespaces/d/configmaps?watch=true&resourceVersion=%d HTTP/1.1\r\nHost: x\r\n\r\n", from); err != nil {
		t.Fatal(err)
	}
	x.waitSubscribers(t, 1)
	var d *chunked.Conn
	testutil.Eventually(t, 10*time.Second, "the subscriber detached", func() bool {
		for _, c := range x.h.conns.Conns(classDetached) {
			d = c
		}
		return d != nil
	})
	const events = 300 // 300 KiB: far more than the connection holds
	last := x.write(t, "cm", events, 1000)
	testutil.Eventually(t, 20*time.Second, "a blocked write's buffer given back", func() bool { return d.GaveBack() > 0 })
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(resp.Body) // net/http undoes the chunking
	for i := 0; i < events; i++ {
		var ev struct {
			Type   string
			Object struct {
				Metadata struct{ Name, ResourceVersion string }
			}
		}
		if err := dec.Decode(&ev); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if want := fmt.Sprintf("cm-%d", i); ev.Type != "ADDED" || ev.Object.Metadata.Name != want {
			t.Fatalf("event %d: %s %s, want ADDED %s", i, ev.Type, ev.Object.Metadata.Name, want)
		}
		if i == events-1 && ev.Object.Metadata.ResourceVersion != rv(last) {
			t.Fatalf("the last event at %s, want %d", ev.Object.Metadata.ResourceVersion, last)
		}
	}
	t.Logf("%d chunks written from the frames after their buffer went back", d.GaveBack())
}

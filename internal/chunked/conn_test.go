package chunked

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/watchsan/watchsan/internal/testutil"
)

// taken is the server's side of a connection a test's handler took.
type taken struct {
	c    *Conn
	left atomic.Int32 // Options.Left's calls
	told chan int64   // Options.Detach's end
	err  error        // Start's
}

// serve starts a server whose handler writes a head with Connection: close, takes the
// connection with o (its Left, Detach counted in the taken it sends) and hands it to the test.
func serve(t *testing.T, o Options, small bool) (url string, got <-chan *taken) {
	t.Helper()
	ch := make(chan *taken, 4)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		if err := rc.Flush(); err != nil {
			t.Errorf("flush: %v", err)
			return
		}
		tk := &taken{told: make(chan int64, 1)}
		o := o
		o.Left = func() { tk.left.Add(1) }
		o.Detach = func() func(int64) { return func(n int64) { tk.told <- n } }
		c, err := Take(rc, o)
		if err != nil {
			t.Errorf("Take: %v", err)
			return
		}
		tk.c, tk.err = c, c.Start()
		ch <- tk
	}))
	if small {
		srv.Listener = testutil.SmallSendBuffers{Listener: srv.Listener}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), ch
}

// dial sends a GET (twice: pipelined) and returns the connection, unread; small: a receive
// buffer of 4 KiB.
func dial(t *testing.T, addr string, pipelined, small bool) net.Conn {
	t.Helper()
	d := net.Dialer{}
	if small {
		d.Control = func(_, _ string, c syscall.RawConn) error {
			return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10) })
		}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	req := "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
	if pipelined {
		req += req
	}
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	return c
}

func next(t *testing.T, got <-chan *taken) *taken {
	t.Helper()
	select {
	case tk := <-got:
		return tk
	case <-time.After(10 * time.Second):
		t.Fatal("the handler never took its connection")
		return nil
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A taken connection carries a chunked body net/http's client reads as any other: the frames
// in order, each WriteFrames one chunk, the body ended by Finish; Release tells the bytes of
// the frames (not the framing) and takes the connection out of its Set.
func TestConnChunkedBody(t *testing.T) {
	var set Set
	addr, got := serve(t, Options{WriteTimeout: 10 * time.Second, Set: &set, Class: 1}, false)
	c := dial(t, addr, false, false)
	tk := next(t, got)
	if tk.err != nil {
		t.Fatalf("Start: %v", tk.err)
	}
	if n := set.Len(1); n != 1 {
		t.Fatalf("%d connections of the class in the set, want 1", n)
	}
	big := strings.Repeat("x", chunkMax+100) // a frame bigger than a chunk: written as it is
	frames := [][]byte{[]byte("a\n"), []byte("bb\n"), []byte(big), nil}
	for _, q := range [][][]byte{frames[:2], frames[2:3], frames[3:]} {
		if err := tk.c.WriteFrames(q); err != nil {
			t.Fatalf("WriteFrames: %v", err)
		}
	}
	var b [chunkHead + 8 + 2]byte
	copy(b[chunkHead:], "ccc\n")
	if err := tk.c.WriteChunk(b[:chunkHead+4]); err != nil {
		t.Fatalf("WriteChunk: %v", err)
	}
	if err := tk.c.WriteRaw([]byte("dd\n")); err != nil {
		t.Fatalf("WriteRaw: %v", err)
	}
	if err := tk.c.Finish(); err != nil {
		t.Fatalf("Finish: %v", err)
	}
	tk.c.Close()
	tk.c.Release()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Close || len(resp.TransferEncoding) != 1 {
		t.Errorf("head: close %v, transfer encoding %v", resp.Close, resp.TransferEncoding)
	}
	body, err := io.ReadAll(resp.Body) // ends at the last chunk, cleanly
	if err != nil {
		t.Fatalf("the body: %v", err)
	}
	want := "a\nbb\n" + big + "ccc\ndd\n"
	if string(body) != want {
		t.Errorf("the body is %d bytes, want %d: %.40q", len(body), len(want), body)
	}
	if n := <-tk.told; n != int64(len(want)) {
		t.Errorf("Release told %d bytes, want %d", n, len(want))
	}
	if n := set.Len(1); n != 0 {
		t.Errorf("%d connections in the set after Release", n)
	}
	if err := set.Wait(context.Background()); err != nil {
		t.Errorf("Wait on an empty set: %v", err)
	}
}

// Each chunk is one write on the connection, its size line right before its frames: what
// WriteChunk and WriteFrames send, byte for byte.
func TestChunkFraming(t *testing.T) {
	buf := append(make([]byte, chunkHead, chunkHead+300+2), strings.Repeat("y", 300)...)
	if got, want := string(frame(buf, sizeLine(nil, 300))), "12c\r\n"+strings.Repeat("y", 300)+"\r\n"; got != want {
		t.Errorf("frame: %q, want %q", got, want)
	}
	if got := string(sizeLine(nil, BatchSize)); got != "10000\r\n" {
		t.Errorf("sizeLine(BatchSize) = %q", got)
	}
}

// The client's leaving is seen by the reader: Left is called once, Gone and Left say so, and
// the next write fails; Release still tells what was written.
func TestConnClientLeaves(t *testing.T) {
	addr, got := serve(t, Options{}, false)
	c := dial(t, addr, false, false)
	tk := next(t, got)
	if tk.c.Gone() {
		t.Fatal("gone before the client left")
	}
	if err := tk.c.WriteFrames([][]byte{[]byte("a\n")}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	select {
	case <-tk.c.Left():
	case <-time.After(10 * time.Second):
		t.Fatal("Left never closed after the client left")
	}
	eventually(t, "Options.Left called", func() bool { return tk.left.Load() == 1 })
	if !tk.c.Gone() {
		t.Error("not Gone after Left closed")
	}
	eventually(t, "a write failing on the closed connection", func() bool {
		return tk.c.WriteFrames([][]byte{[]byte("b\n")}) != nil
	})
	tk.c.Close()
	tk.c.Release()
	if n := <-tk.told; n < 2 {
		t.Errorf("told %d bytes, want at least the first frame's 2", n)
	}
	if n := tk.left.Load(); n != 1 {
		t.Errorf("Left called %d times, want once", n)
	}
}

// A client that sent more after its request (pipelined) is a request watchsan will not
// answer on a connection it said it closes: Start says so, the client counts as gone, and
// Left is not called (the caller ends the stream as it should).
func TestConnPipelined(t *testing.T) {
	addr, got := serve(t, Options{}, false)
	dial(t, addr, true, false)
	tk := next(t, got)
	if !errors.Is(tk.err, ErrPipelined) {
		t.Fatalf("Start: %v, want ErrPipelined", tk.err)
	}
	if !tk.c.Gone() {
		t.Error("not Gone")
	}
	tk.c.Close()
	tk.c.Release() // does not wait for a reader that never ran
	if n := tk.left.Load(); n != 0 {
		t.Errorf("Left called %d times", n)
	}
}

// Wait gives up at its context's end: a connection with Abort has it called, one without is
// closed (its next write fails); a connection started after is refused, closed, and Wait is
// not blocked by it.
func TestSetWaitBounded(t *testing.T) {
	var set Set
	aborted := make(chan struct{}, 1)
	addr, got := serve(t, Options{Set: &set, Abort: func() { aborted <- struct{}{} }}, false)
	dial(t, addr, false, false)
	withAbort := next(t, got)
	addr2, got2 := serve(t, Options{Set: &set}, false)
	dial(t, addr2, false, false)
	plain := next(t, got2)
	if n := set.Len(0); n != 2 {
		t.Fatalf("%d in the set, want 2", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() { waited <- set.Wait(ctx) }()
	cancel()
	select {
	case err := <-waited:
		if err == nil {
			t.Fatal("Wait returned nil with connections open")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not give up at its context's end")
	}
	select {
	case <-aborted:
	case <-time.After(10 * time.Second):
		t.Fatal("Abort never called")
	}
	eventually(t, "the plain connection closed", func() bool {
		return plain.c.WriteFrames([][]byte{[]byte("x\n")}) != nil && plain.c.Gone()
	})
	if withAbort.c.Gone() {
		t.Error("the connection with Abort was closed by Wait: Abort is its owner's")
	}
	dial(t, addr2, false, false)
	late := next(t, got2)
	if !errors.Is(late.err, ErrRefused) {
		t.Fatalf("Start after Wait gave up: %v, want ErrRefused", late.err)
	}
	if late.c.WriteFrames([][]byte{[]byte("x\n")}) == nil {
		t.Error("a refused connection still takes writes")
	}
	for _, tk := range []*taken{withAbort, plain, late} {
		tk.c.Close()
		tk.c.Release()
	}
	if n := set.Len(0); n != 0 {
		t.Errorf("%d left in the set", n)
	}
}

// A client that stops reading: a chunk whose one write blocks gives its buffer back and is
// written from its frames (put), and once the write timeout passes the write fails with
// os.ErrDeadlineExceeded. A client that then reads gets every chunk whole.
func TestConnBlockedWrite(t *testing.T) {
	for _, timeout := range []time.Duration{300 * time.Millisecond, time.Minute} {
		t.Run(fmt.Sprint(timeout), func(t *testing.T) {
			addr, got := serve(t, Options{WriteTimeout: timeout}, true)
			c := dial(t, addr, false, true)
			tk := next(t, got)
			frame := []byte(strings.Repeat("z", 1000) + "\n")
			q := make([][]byte, 60) // 60 KB a chunk
			for i := range q {
				q[i] = frame
			}
			written := 0
			var werr error
			done := make(chan struct{})
			go func() {
				defer close(done)
				for written < 100 && werr == nil {
					if werr = tk.c.WriteFrames(q); werr == nil {
						written++
					}
				}
			}()
			if timeout < time.Minute {
				<-done
				if !errors.Is(werr, os.ErrDeadlineExceeded) {
					t.Fatalf("a write to a client that does not read: %v, want the deadline's", werr)
				}
				if tk.c.GaveBack() == 0 {
					t.Error("the blocked chunk kept its buffer")
				}
				tk.c.Close()
				tk.c.Release()
				return
			}
			eventually(t, "a blocked write's buffer given back", func() bool { return tk.c.GaveBack() > 0 })
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			n, err := io.CopyN(io.Discard, resp.Body, int64(100*len(q)*len(frame)))
			if err != nil {
				t.Fatalf("the body after %d bytes: %v", n, err)
			}
			<-done
			if werr != nil {
				t.Fatalf("WriteFrames: %v", werr)
			}
			tk.c.Close()
			tk.c.Release()
			if n := <-tk.told; n != int64(100*len(q)*len(frame)) {
				t.Errorf("told %d bytes", n)
			}
		})
	}
}

package upstream

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// goawayFront is an HTTPS HTTP/2 upstream whose first connection reads a request's HEADERS
// and answers with a GOAWAY that names no stream as processed (last stream ID 0, NO_ERROR):
// what an apiserver does to the requests that raced its Connection: close. Later connections
// are passed to a real server that echoes the body.
type goawayFront struct {
	ln      net.Listener
	goaways atomic.Int32
	served  atomic.Int32
}

func newGoawayFront(t *testing.T) (*goawayFront, *httptest.Server) {
	f := &goawayFront{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.served.Add(1)
		io.Copy(w, r.Body)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	f.ln = ln
	cfg := srv.TLS.Clone()
	cfg.NextProtos = []string{http2.NextProtoTLS}
	go func() {
		for first := true; ; first = false {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if first {
				go f.goaway(tls.Server(c, cfg))
				continue
			}
			go pipe(c, srv.Listener.Addr().String())
		}
	}()
	return f, srv
}

func (f *goawayFront) goaway(c *tls.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil {
		return
	}
	fr := http2.NewFramer(c, c)
	if fr.WriteSettings() != nil {
		return
	}
	for {
		fr0, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch fr0 := fr0.(type) {
		case *http2.SettingsFrame:
			if !fr0.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.HeadersFrame:
			f.goaways.Add(1)
			_ = fr.WriteGoAway(0, http2.ErrCodeNo, nil)
			// Read on until the client closes: it must see the GOAWAY before any EOF.
		}
	}
}

func pipe(c net.Conn, to string) {
	defer c.Close()
	u, err := net.Dial("tcp", to)
	if err != nil {
		return
	}
	defer u.Close()
	go io.Copy(u, c)
	io.Copy(c, u)
}

// a POST whose stream the upstream did not process (above a GOAWAY's last
// stream ID) is replayed by the transport on a new connection, body and all: the Attempter
// gives it GetBody. Before, the client got a 502 ("http2: Transport: cannot retry ... after
// Request.Body was written").
func TestUnprocessedPostReplayed(t *testing.T) {
	f, srv := newGoawayFront(t)
	roots := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	p := newPool(t, PoolOptions{Transport: TransportOptions{RootCAs: roots}}, "https://"+f.ln.Addr().String())
	a := attempter(p, AttempterOptions{}, &sleeps{})
	body := strings.Repeat("x", 100<<10)
	req, _ := http.NewRequest(http.MethodPost, "/api/v1/namespaces/d/pods", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer t") // an authenticated client's: over the shared HTTP/2 connection
	resp, err := doPlan(t, a, req, Plan{Credentials: Decide(req.Header, nil, false, IdentityOff)})
	if err != nil {
		t.Fatalf("a POST the upstream did not process failed: %v", err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if f.goaways.Load() != 1 || f.served.Load() != 1 {
		t.Fatalf("%d GOAWAYs, %d served: want the first attempt sent away, the replay served", f.goaways.Load(), f.served.Load())
	}
	if resp.StatusCode != 200 || !bytes.Equal(got, []byte(body)) {
		t.Fatalf("replay answered %d with %d bytes, want 200 and the %d bytes sent", resp.StatusCode, len(got), len(body))
	}
}

// A body of unknown length is replayed too, and the bound is on what the transport read: a
// body read past MaxReplayBody can no longer be replayed, and the reader at its head goes on.
func TestReplayBound(t *testing.T) {
	f, srv := newGoawayFront(t)
	roots := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	p := newPool(t, PoolOptions{Transport: TransportOptions{RootCAs: roots}}, "https://"+f.ln.Addr().String())
	a := attempter(p, AttempterOptions{}, &sleeps{})
	req, _ := http.NewRequest(http.MethodPost, "/api/v1/namespaces/d/pods", io.MultiReader(strings.NewReader("chunked")))
	req.Header.Set("Authorization", "Bearer t")
	resp, err := doPlan(t, a, req, Plan{Credentials: Decide(req.Header, nil, false, IdentityOff)})
	if err != nil {
		t.Fatalf("a body of unknown length was not replayed: %v", err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(got) != "chunked" {
		t.Fatalf("replayed %q", got)
	}

	big := make([]byte, MaxReplayBody+10)
	for i := range big {
		big[i] = byte(i)
	}
	c := newCountingBody(httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(big)))
	first, get := c.open()
	head := make([]byte, 1000)
	if _, err := io.ReadFull(first, head); err != nil {
		t.Fatal(err)
	}
	replay, err := get()
	if err != nil {
		t.Fatalf("GetBody within the bound: %v", err)
	}
	if all, err := io.ReadAll(replay); err != nil || !bytes.Equal(all, big) {
		t.Fatalf("a replay read %d bytes (%v), want the whole body from its start", len(all), err)
	}
	if _, err := get(); err == nil {
		t.Fatal("GetBody after more than MaxReplayBody was read: want an error")
	}
	if _, err := first.Read(head); err == nil {
		t.Fatal("a reader behind the head of a body no longer kept read on")
	}
	if c.read.Load() != int64(len(big)+1000) {
		t.Fatalf("read %d, want every byte handed out counted", c.read.Load())
	}
}

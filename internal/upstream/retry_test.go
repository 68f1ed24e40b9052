package upstream

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
)

func pool(t *testing.T, urls ...string) *Pool {
	t.Helper()
	var us []*url.URL
	for _, s := range urls {
		u, _ := url.Parse(s)
		us = append(us, u)
	}
	p, err := NewPool(us, TransportOptions{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func deadURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return "http://" + ln.Addr().String()
}

type sleeps struct{ got []time.Duration }

func (s *sleeps) sleep(_ context.Context, d time.Duration) error {
	s.got = append(s.got, d)
	return nil
}

func TestRetryIdempotentOn503HonoursRetryAfter(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) <= 2 {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "apiserver is shutting down", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	var sl sleeps
	var outcomes []string
	rt := &Retrier{Pool: pool(t, srv.URL), Budget: 10 * time.Second, Sleep: sl.sleep, OnRetry: func(o string) { outcomes = append(outcomes, o) }}
	req, _ := http.NewRequest("GET", "/api/v1/pods", nil)
	resp, err := rt.RoundTrip(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("got %v %v", resp, err)
	}
	if n.Load() != 3 || len(sl.got) != 2 || sl.got[0] != time.Second {
		t.Fatalf("attempts %d, sleeps %v: want 3 attempts, two 1s waits (Retry-After)", n.Load(), sl.got)
	}
	if strings.Join(outcomes, ",") != "retried,retried,recovered" {
		t.Fatalf("outcomes %v", outcomes)
	}
}

func TestNoRetryOfPostAfterItReachedUpstream(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		io.Copy(io.Discard, r.Body)
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	var sl sleeps
	rt := &Retrier{Pool: pool(t, srv.URL), Budget: 10 * time.Second, Sleep: sl.sleep}
	req, _ := http.NewRequest("POST", "/api/v1/namespaces/d/configmaps", strings.NewReader(`{"a":1}`))
	resp, err := rt.RoundTrip(req)
	if err != nil || resp.StatusCode != 503 || n.Load() != 1 {
		t.Fatalf("got %v %v after %d attempts; a POST that reached the upstream must not be retried", resp, err, n.Load())
	}
}

func TestPostRetriedWhenDialFailed(t *testing.T) {
	var body atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		body.Store(string(b))
		w.WriteHeader(201)
	}))
	defer srv.Close()
	var sl sleeps
	p := pool(t, deadURL(t), srv.URL)
	rt := &Retrier{Pool: p, Budget: 10 * time.Second, Sleep: sl.sleep}
	for i := 0; i < 4; i++ { // whichever backend round-robin starts with
		req, _ := http.NewRequest("POST", "/x", strings.NewReader(`{"a":1}`))
		resp, err := rt.RoundTrip(req)
		if err != nil || resp.StatusCode != 201 {
			t.Fatalf("got %v %v", resp, err)
		}
		if body.Load() != `{"a":1}` {
			t.Fatalf("body at upstream %q", body.Load())
		}
	}
}

func TestBudgetSpentReturnsLastAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	var outcomes []string
	rt := &Retrier{Pool: pool(t, srv.URL), Budget: 300 * time.Millisecond, OnRetry: func(o string) { outcomes = append(outcomes, o) }}
	req, _ := http.NewRequest("GET", "/x", nil)
	start := time.Now()
	resp, err := rt.RoundTrip(req)
	if err != nil || resp.StatusCode != 503 {
		t.Fatalf("got %v %v", resp, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %v with a 300ms budget", d)
	}
	if len(outcomes) == 0 || outcomes[len(outcomes)-1] != "exhausted" {
		t.Fatalf("outcomes %v", outcomes)
	}
	// All backends down: the error names the backend.
	rt = &Retrier{Pool: pool(t, deadURL(t)), Budget: 0}
	_, err = rt.RoundTrip(req)
	if err == nil || Name(err) == "upstream" {
		t.Fatalf("err %v", err)
	}
}

func TestPickPrefersHealthyAndAvoids(t *testing.T) {
	p := pool(t, "http://a", "http://b", "http://c")
	a, b, c := p.backends[0], p.backends[1], p.backends[2]
	b.healthy.Store(false)
	for i := 0; i < 10; i++ {
		if got := p.PickExcept(a); got != c {
			t.Fatalf("PickExcept(a) with b down = %v, want c", got)
		}
	}
	a.healthy.Store(false)
	c.healthy.Store(false)
	if got := p.Pick(); got == nil {
		t.Fatal("all down: Pick must still return a last resort")
	}
	if p.Ready() {
		t.Fatal("Ready with every backend down")
	}
}

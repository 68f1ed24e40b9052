package upstream

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watchsan/watchsan/internal/testutil"
)

// a request waiting on a backend that is declared unhealthy is cut at once:
// a GET, an unread body and a PUT or PATCH with a resourceVersion precondition go to another
// backend; a create is answered ErrFrozen (the client's 503), and never sent again.
func TestFrozenBackendCutsWaitingRequests(t *testing.T) {
	release := make(chan struct{})
	var arrived atomic.Int32
	frozen := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		arrived.Add(1)
		<-release
	}))
	defer frozen.Close()
	defer close(release)
	var served atomic.Int32
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		io.WriteString(w, r.Method)
	}))
	defer good.Close()
	for _, tc := range []struct {
		method, ctype, body string
		retried             bool
	}{
		{"GET", "", "", true},
		{"PUT", "application/json", `{"metadata":{"name":"x","resourceVersion":"42"}}`, true},
		{"PATCH", "application/merge-patch+json", `{"metadata":{"resourceVersion":"42"},"data":{"a":"b"}}`, true},
		{"PATCH", "application/json-patch+json", `[{"op":"test","path":"/metadata/resourceVersion","value":"42"},{"op":"remove","path":"/data/a"}]`, true},
		{"POST", "application/json", `{"metadata":{"name":"x"}}`, false},
		{"PUT", "application/json", `{"metadata":{"name":"x"}}`, false},
		{"PATCH", "application/merge-patch+json", `{"data":{"a":"b"}}`, false},
		{"DELETE", "", "", false},
	} {
		t.Run(tc.method+" "+tc.body, func(t *testing.T) {
			p := newPool(t, PoolOptions{}, frozen.URL, good.URL)
			fb, gb := p.Backends()[0], p.Backends()[1]
			a := attempter(p, AttempterOptions{}, nil)
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			req, _ := http.NewRequest(tc.method, "/api/v1/namespaces/d/configmaps/x", body)
			if tc.ctype != "" {
				req.Header.Set("Content-Type", tc.ctype)
			}
			n0, s0 := arrived.Load(), served.Load()
			type result struct {
				at  Attempt
				err error
			}
			out := make(chan result, 1)
			go func() {
				at, err := a.Do(req.Context(), req, Plan{Avoid: gb, Credentials: Decide(req.Header, nil, false, IdentityOff)})
				out <- result{at, err}
			}()
			for arrived.Load() == n0 { // it waits on the frozen backend now
				time.Sleep(time.Millisecond)
			}
			cutAt := time.Now()
			p.setState(fb, Unhealthy, errors.New("no answer to HTTP/2 PING"))
			var r result
			select {
			case r = <-out:
			case <-time.After(5 * time.Second):
				t.Fatal("the request still waits on the backend declared unhealthy")
			}
			took := time.Since(cutAt)
			if tc.retried {
				if r.err != nil {
					t.Fatalf("not retried elsewhere: %v", r.err)
				}
				got, _ := io.ReadAll(r.at.Resp.Body)
				r.at.Cancel(nil)
				if r.at.Backend != gb || string(got) != tc.method {
					t.Fatalf("answered by %v with %q", r.at.Backend, got)
				}
			} else {
				if !errors.Is(r.err, ErrFrozen) {
					t.Fatalf("err %v, want ErrFrozen", r.err)
				}
				if served.Load() != s0 {
					t.Fatal("a request that is not safe to repeat was sent again")
				}
			}
			if took > time.Second {
				t.Fatalf("answered %v after the verdict, want at once", took)
			}
		})
	}
}

// A request cut on one frozen backend and then on the next backs off as after any failure:
// the second wait is a second delay of the backoff (it is not started over at each cut).
func TestFrozenCutsBackOff(t *testing.T) {
	release := make(chan struct{})
	var arrived [2]atomic.Int32
	hang := func(i int) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			arrived[i].Add(1)
			<-release
		})
	}
	f1, f2 := httptest.NewServer(hang(0)), httptest.NewServer(hang(1))
	defer f1.Close()
	defer f2.Close()
	defer close(release)
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer good.Close()
	p := newPool(t, PoolOptions{}, f1.URL, f2.URL, good.URL)
	frozen, gb := p.Backends()[:2], p.Backends()[2]
	p.setState(gb, Degraded, errors.New("/readyz did not pass")) // tried last: the frozen ones first
	sl := &sleeps{}
	a := attempter(p, AttempterOptions{}, sl)
	req, _ := http.NewRequest(http.MethodGet, "/api/v1/namespaces/d/configmaps", nil)
	out := make(chan error, 1)
	go func() {
		at, err := a.Do(req.Context(), req, Plan{Credentials: Decide(req.Header, nil, false, IdentityOff)})
		if err == nil {
			at.Cancel(nil)
			if at.Backend != gb {
				err = errors.New("answered by " + at.Backend.String())
			}
		}
		out <- err
	}()
	for cut := 0; cut < 2; cut++ {
		var on *Backend
		testutil.Eventually(t, 5*time.Second, "the request waiting on a frozen backend", func() bool {
			for i, b := range frozen {
				if arrived[i].Load() > 0 && b.State() != Unhealthy {
					on = b
				}
			}
			return on != nil
		})
		p.setState(on, Unhealthy, errors.New("no answer to HTTP/2 PING"))
	}
	select {
	case err := <-out:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not answered after both cuts")
	}
	sl.mu.Lock()
	defer sl.mu.Unlock()
	first := time.Duration(float64(RequestBackoff.Initial) * (1 + RequestBackoff.Jitter)) // the longest first delay
	if len(sl.got) != 2 || sl.got[0] > first || sl.got[1] <= first {
		t.Fatalf("waits %v before the retries, want two, the second past the longest first delay %v", sl.got, first)
	}
}

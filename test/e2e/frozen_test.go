package e2e

// Nothing waits on a frozen apiserver (docs/design.md section 10.8): requests
// already sent to an apiserver when it froze (SIGSTOP) are answered within about the time
// watchsan takes to find it unhealthy plus one attempt, not when the client gives up: reads
// retried on the other apiserver, a create answered 503 with Retry-After, saying it may have
// happened (or sent elsewhere when not a byte of its body had gone: it waited for a connection
// to the frozen apiserver; the unit test TestFrozenBackendCutsWaitingRequests holds each case
// deterministically).

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/watchsan/watchsan/test/cluster"
)

func TestFrozenAPIServerRequestsAnswered(t *testing.T) {
	c := newCluster(t, cluster.Options{APIServers: 2})
	ns := resilienceNamespace(t, c, "frozen")
	p := startProxy(t, "--upstream="+c.APIServers[0].URL, "--upstream="+c.APIServers[1].URL, "--upstream-ca-file="+c.CAFile,
		"--no-credentials", "--log-level=info")
	for i := range c.APIServers {
		waitUpstreamUp(t, p, c.APIServers[i].URL)
	}
	client := &http.Client{Timeout: 30 * time.Second}
	type answer struct {
		method  string
		code    int
		took    time.Duration
		retry   string
		message string
	}
	send := func(method, path, body string) answer {
		req, _ := http.NewRequest(method, p.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+c.AdminToken)
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		resp, err := client.Do(req)
		a := answer{method: method, took: time.Since(start)}
		if err != nil {
			a.message = err.Error()
			return a
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		a.code, a.retry = resp.StatusCode, resp.Header.Get("Retry-After")
		var st struct{ Message string }
		if json.Unmarshal(b, &st) == nil {
			a.message = st.Message
		}
		return a
	}
	if a := send("GET", "/api/v1/namespaces/"+ns+"/configmaps", ""); a.code != 200 {
		t.Fatalf("GET through watchsan: %+v", a)
	}
	a0 := c.APIServers[0]
	round := func(r int) (slowGets, waitedPosts int) {
		if err := a0.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		frozenAt := time.Now()
		t.Cleanup(func() { _ = a0.Signal(syscall.SIGCONT) })
		// Requests at once, concurrently: the balancer alternates between the two apiservers
		// while their loads are equal, so some of each kind wait on the frozen one.
		var mu sync.Mutex
		var answers []answer
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Add(2)
			go func() {
				defer wg.Done()
				a := send("GET", "/api/v1/namespaces/"+ns+"/configmaps", "")
				mu.Lock()
				answers = append(answers, a)
				mu.Unlock()
			}()
			go func() {
				defer wg.Done()
				a := send("POST", "/api/v1/namespaces/"+ns+"/configmaps", fmt.Sprintf(`{"metadata":{"name":"frozen-%d-%d"}}`, r, i))
				mu.Lock()
				answers = append(answers, a)
				mu.Unlock()
			}()
		}
		wg.Wait()
		answeredIn := time.Since(frozenAt)
		if err := a0.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		// The bound: detection (a health interval and 1.5 ping timeouts, 2.5 s by default) plus one
		// attempt, with slack for -race on a busy machine (haFreezeBound).
		var frozenPosts, unsentPosts int
		for _, a := range answers {
			t.Logf("frozen: %s answered %d in %v (Retry-After %q) %.160s", a.method, a.code, a.took.Round(time.Millisecond), a.retry, a.message)
			if a.took > haFreezeBound {
				t.Errorf("%s answered after %v with the apiserver frozen, want within %v", a.method, a.took, haFreezeBound)
			}
			switch {
			case a.method == "GET" && a.code != 200:
				t.Errorf("a GET got %d, want 200 (retried on the other apiserver): %s", a.code, a.message)
			case a.method == "GET" && a.took > time.Second:
				slowGets++ // it waited on the frozen one, then went to the other
			case a.method == "POST" && a.code == 503:
				frozenPosts++
				if a.retry == "" || !strings.Contains(a.message, "may have been processed") {
					t.Errorf("a POST cut on the frozen apiserver got Retry-After %q, message %q: want both, saying it may have happened", a.retry, a.message)
				}
			case a.method == "POST" && a.code != 201:
				t.Errorf("a POST got %d: %s", a.code, a.message)
			case a.method == "POST" && a.took > time.Second:
				unsentPosts++ // it waited without its body sent (a connection in its handshake): sent elsewhere
			}
		}
		t.Logf("frozen: all 8 requests answered %v after the freeze; %d GETs retried on the other apiserver, %d POSTs answered 503, %d POSTs never sent there retried", answeredIn.Round(time.Millisecond), slowGets, frozenPosts, unsentPosts)
		return slowGets, frozenPosts + unsentPosts
	}
	// Which requests the balancer sends to the frozen apiserver depends on the order they
	// arrive in: a round where none of one kind waited on it proves nothing of that kind, and
	// is taken again (at most 3), once the apiserver is back and healthy.
	var slowGets, waitedPosts int
	for r := 0; r < 3 && (slowGets == 0 || waitedPosts == 0); r++ {
		if r > 0 {
			waitUpstreamUp(t, p, a0.URL)
		}
		g, w := round(r)
		slowGets, waitedPosts = slowGets+g, waitedPosts+w
	}
	if slowGets == 0 || waitedPosts == 0 {
		t.Errorf("%d GETs and %d POSTs waited on the frozen apiserver in 3 rounds: want some of each (else this run proves nothing)", slowGets, waitedPosts)
	}
	requireNoPanic(t, p)
}

package e2e

// Health probes that cost clients nothing (issue 20 item 5, docs/design.md section 10): with
// --no-credentials the /readyz probes go anonymous, and an apiserver answers an anonymous
// request on HTTP/2 with Connection: close (UnauthenticatedHTTP2DOSMitigation, on by default),
// which closes the connection it came on. On the connection client requests share, that cut
// it every probe.

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/watchsan/watchsan/test/cluster"
)

// TestProbesOnAConnectionOfTheirOwn: a client sends its own token through watchsan
// (--no-credentials, the HA setup) for a while, with /readyz probed every second. The
// connections client requests share are not dialled again after the first: the anonymous
// probes, closed by the apiserver after each, dial only the health checker's.
func TestProbesOnAConnectionOfTheirOwn(t *testing.T) {
	c := newCluster(t, cluster.Options{APIServers: 1})
	a := c.APIServers[0]
	p := startProxy(t, "--upstream="+a.URL, "--upstream-ca-file="+c.CAFile, "--no-credentials",
		"--health-probe-interval=1s", "--log-level=info")
	waitUpstreamUp(t, p, a.URL)
	dialled := func(conn string) float64 {
		return p.Metric(dialsMetric, map[string]string{"upstream": a.URL, "connection": conn, "result": "ok"})
	}
	get := func() int {
		req, _ := http.NewRequest(http.MethodGet, p.URL+"/api/v1/namespaces/default", nil)
		req.Header.Set("Authorization", "Bearer "+c.AdminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET through watchsan: %v", err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(); code != 200 { // the client requests' connection is open now
		t.Fatalf("GET through watchsan: %d", code)
	}
	reqs0, health0 := dialled("requests"), dialled("health")
	window := 15 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), window)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var n, failed int
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-tick.C:
			n++
			if code := get(); code != 200 {
				failed++
			}
		}
	}
	reqs, health := dialled("requests")-reqs0, dialled("health")-health0
	t.Logf("probes: in %v with /readyz every 1s (anonymous): %v new client-request connections, %v new health-checker connections; %d of %d requests failed",
		window, reqs, health, failed, n)
	if reqs != 0 {
		t.Errorf("the connections client requests share were dialled %v times in %v: the anonymous probes still go over them", reqs, window)
	}
	if health < 5 {
		// The premise: the apiserver does close anonymous HTTP/2 connections. If it no longer
		// does, this test proves nothing.
		t.Errorf("the health checker dialled only %v times in %v: does the apiserver still close anonymous HTTP/2 connections (UnauthenticatedHTTP2DOSMitigation)?", health, window)
	}
	if failed != 0 {
		t.Errorf("%d requests failed", failed)
	}
	requireNoPanic(t, p)
}

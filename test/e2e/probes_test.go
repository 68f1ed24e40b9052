package e2e

// Health probes that cost clients nothing (docs/design.md section 10): with
// --no-credentials the /readyz probes go anonymous, and an apiserver answers an anonymous
// request on HTTP/2 with Connection: close (UnauthenticatedHTTP2DOSMitigation, on by default),
// which closes the connection it came on. On the connection client requests share, that cut
// it every probe.

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

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

// TestRestartedAPIServerNotReadyWhileUnauthorized: a restarted apiserver answers /readyz 403
// until its RBAC authorizer has synced (docs/design.md section 10.6). watchsan must not count
// it healthy before a /readyz it can be authorized for passes: with a probe identity (the
// limited user: /readyz needs nothing but being authenticated; the admin's system:masters
// would pass before RBAC), and anonymous once an anonymous probe has passed before.
func TestRestartedAPIServerNotReadyWhileUnauthorized(t *testing.T) {
	c := newCluster(t, cluster.Options{APIServers: 1})
	a := c.APIServers[0]
	kc := filepath.Join(t.TempDir(), "probe.kubeconfig")
	if err := c.WriteKubeconfig(kc, a.URL, c.UserToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	// Probed every 50 ms while not healthy: the window of 403s may be short (seen: 60-1600 ms).
	common := []string{"--upstream=" + a.URL, "--upstream-ca-file=" + c.CAFile, "--no-credentials", "--log-level=info", "--health-interval=50ms"}
	withID := startProxy(t, append(common, "--probe-kubeconfig="+kc)...)
	anon := startProxy(t, common...)
	waitUpstreamUp(t, withID, a.URL)
	waitUpstreamUp(t, anon, a.URL)

	// Poll /readyz directly, as the limited user and anonymous, from the kill on.
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(c.CAData)
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	type firstPass struct {
		at     time.Time
		denied int // 401/403 answers before it
	}
	poll := func(ctx context.Context, token string, out chan<- firstPass) {
		var fp firstPass
		for ctx.Err() == nil {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.URL+"/readyz", nil)
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := client.Do(req)
			if err == nil {
				resp.Body.Close()
				switch resp.StatusCode {
				case 200:
					fp.at = time.Now()
					out <- fp
					return
				case 401, 403:
					fp.denied++
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		out <- fp
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := a.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	eventually(t, 30*time.Second, "watchsan to see the apiserver go", func() bool {
		return withID.Metric("watchsan_upstream_up", map[string]string{"upstream": a.URL}) == 0 &&
			anon.Metric("watchsan_upstream_up", map[string]string{"upstream": a.URL}) == 0
	})
	userPass, anonPass := make(chan firstPass, 1), make(chan firstPass, 1)
	go poll(ctx, c.UserToken, userPass)
	go poll(ctx, "", anonPass)
	if err := a.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	up, an := <-userPass, <-anonPass
	if up.at.IsZero() || an.at.IsZero() {
		t.Fatal("/readyz never passed after the restart")
	}
	waitUpstreamUp(t, withID, a.URL)
	waitUpstreamUp(t, anon, a.URL)
	healthyAt := func(p *proxy) time.Time {
		var last time.Time
		for _, line := range p.logLines() {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) != nil || m["msg"] != "upstream healthy" {
				continue
			}
			ts, err := time.Parse("2006-01-02T15:04:05.000Z0700", fmt.Sprint(m["ts"]))
			if err != nil {
				t.Fatalf("log time %v: %v", m["ts"], err)
			}
			last = ts
		}
		if !last.After(killed) {
			t.Fatalf("no 'upstream healthy' line after the restart")
		}
		return last
	}
	hID, hAnon := healthyAt(withID), healthyAt(anon)
	t.Logf("probes: after the restart /readyz answered 401/403 %d times to the limited user (first pass %v after the kill) and %d times anonymous (first pass %v); watchsan healthy %v after the kill with a probe identity, %v anonymous",
		up.denied, up.at.Sub(killed).Round(time.Millisecond), an.denied, an.at.Sub(killed).Round(time.Millisecond),
		hID.Sub(killed).Round(time.Millisecond), hAnon.Sub(killed).Round(time.Millisecond))
	// The log's times have millisecond precision; the direct poll finds a pass up to 20 ms late.
	const slack = 100 * time.Millisecond
	if hID.Before(up.at.Add(-slack)) {
		t.Errorf("with a probe identity watchsan counted the restarted apiserver healthy %v before /readyz passed for that identity", up.at.Sub(hID))
	}
	if hAnon.Before(an.at.Add(-slack)) {
		t.Errorf("anonymous, watchsan counted the restarted apiserver healthy %v before an anonymous /readyz passed", an.at.Sub(hAnon))
	}
	if up.denied == 0 && an.denied == 0 {
		t.Log("probes: the restarted apiserver denied no /readyz this time (its authorizer synced before it listened): this run proves nothing about 403s")
	}
	requireNoPanic(t, withID)
	requireNoPanic(t, anon)
}

// TestUnauthenticatedClientsOnConnectionsOfTheirOwn: clients' requests the apiserver does not
// authenticate, anonymous ones and those with a token it refuses (401), cost the clients who
// share watchsan's connections nothing (docs/design.md section 10.5). With --no-credentials, a
// client watch with its own token stays open and the shared connections are dialled at most
// once more (the refused token's first 401) while 30 anonymous and 30 refused requests are
// answered; direct, each of them ends its HTTP/2 connection.
func TestUnauthenticatedClientsOnConnectionsOfTheirOwn(t *testing.T) {
	c := newCluster(t, cluster.Options{APIServers: 1})
	a := c.APIServers[0]

	// The premise, direct: the apiserver ends an HTTP/2 connection after an anonymous
	// request and after a 401 (UnauthenticatedHTTP2DOSMitigation).
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(c.CAData)
	var directDials atomic.Int32
	d := &net.Dialer{}
	direct := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{ForceAttemptHTTP2: true,
		TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, n, addr string) (net.Conn, error) {
			directDials.Add(1)
			return d.DialContext(ctx, n, addr)
		}}}
	send := func(client *http.Client, base, token string) int {
		req, _ := http.NewRequest(http.MethodGet, base+"/api/v1/namespaces/default/configmaps", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", base, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := 0; i < 3; i++ {
		send(direct, a.URL, "")
		send(direct, a.URL, "not-a-token")
	}
	if n := directDials.Load(); n < 6 {
		t.Fatalf("direct, 6 unauthenticated requests took %d connections: does the apiserver still close them (UnauthenticatedHTTP2DOSMitigation)? This test proves nothing then", n)
	}

	p := startProxy(t, "--upstream="+a.URL, "--upstream-ca-file="+c.CAFile, "--no-credentials", "--log-level=info")
	waitUpstreamUp(t, p, a.URL)
	dialled := func(conn string) float64 {
		return p.Metric(dialsMetric, map[string]string{"upstream": a.URL, "connection": conn, "result": "ok"})
	}
	// A client watch with its own token, over the shared connections.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=0", nil)
	req.Header.Set("Authorization", "Bearer "+c.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("watch through watchsan: %v %v", resp, err)
	}
	defer resp.Body.Close()
	events := make(chan string, 100)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			events <- sc.Text()
		}
	}()
	reqs0 := dialled("requests")
	var anon, refused []int
	for i := 0; i < 30; i++ {
		anon = append(anon, send(http.DefaultClient, p.URL, ""))
		refused = append(refused, send(http.DefaultClient, p.URL, "not-a-token"))
		if code := send(http.DefaultClient, p.URL, c.AdminToken); code != 200 {
			t.Fatalf("an authenticated GET through watchsan: %d", code)
		}
	}
	for i := range refused {
		if refused[i] != 401 || (anon[i] != 403 && anon[i] != 200) {
			t.Fatalf("answers: anonymous %v, refused token %v; want 403 (or 200) and 401", anon, refused)
		}
	}
	reqs, unauth := dialled("requests")-reqs0, dialled("unauthenticated")
	t.Logf("unauthenticated: 30 anonymous and 30 refused requests through watchsan: %v new shared connections, %v unauthenticated ones (direct, 6 such requests took %d)",
		reqs, unauth, directDials.Load())
	if reqs > 1 {
		t.Errorf("the shared connections were dialled %v times for 60 unauthenticated requests, want at most 1 (the refused token's first 401)", reqs)
	}
	if unauth < 59 {
		t.Errorf("unauthenticated connections dialled %v times for 59 requests (each ended by the apiserver after its request): did some go over the shared ones?", unauth)
	}
	// The watch never broke: it sees a configmap created now.
	cs := kubernetes.NewForConfigOrDie(c.RESTConfig(0, c.AdminToken))
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after-unauthenticated"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(30 * time.Second)
	for seen := false; !seen; {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("the client's watch ended while unauthenticated requests were answered")
			}
			seen = strings.Contains(ev, `"after-unauthenticated"`)
		case <-deadline:
			t.Fatal("the client's watch did not deliver the configmap created after the unauthenticated requests")
		}
	}
	requireNoPanic(t, p)
}

package e2e

import (
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/watchsan/watchsan/test/cluster"
)

// roundRobin is a TCP load balancer in front of watchsan replicas, as a Service or an L4
// balancer is: each new connection goes to the next backend, skipping one that refuses it.
type roundRobin struct {
	ln       net.Listener
	backends []string
	next     atomic.Uint64

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// startRoundRobin balances a loopback port over backends until the test ends.
func startRoundRobin(t *testing.T, backends ...string) *roundRobin {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lb := &roundRobin{ln: ln, backends: backends, conns: map[net.Conn]struct{}{}}
	go lb.serve()
	t.Cleanup(lb.close)
	return lb
}

func (lb *roundRobin) serve() {
	for {
		c, err := lb.ln.Accept()
		if err != nil {
			return
		}
		go lb.splice(c)
	}
}

// splice connects c to the next backend that takes a connection (each tried at most once).
func (lb *roundRobin) splice(c net.Conn) {
	n := lb.next.Add(1)
	var up net.Conn
	for i := range lb.backends {
		b := lb.backends[(int(n)+i)%len(lb.backends)]
		var err error
		if up, err = net.DialTimeout("tcp", b, time.Second); err == nil {
			break
		}
	}
	if up == nil {
		c.Close()
		return
	}
	if !lb.track(c, up) {
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done // either side ended: both go
	c.Close()
	up.Close()
	<-done
	lb.mu.Lock()
	delete(lb.conns, c)
	delete(lb.conns, up)
	lb.mu.Unlock()
}

// track records c and up for close; false: the balancer is closed (and so are they).
func (lb *roundRobin) track(c, up net.Conn) bool {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.conns == nil {
		c.Close()
		up.Close()
		return false
	}
	lb.conns[c], lb.conns[up] = struct{}{}, struct{}{}
	return true
}

func (lb *roundRobin) close() {
	lb.ln.Close()
	lb.mu.Lock()
	conns := lb.conns
	lb.conns = nil
	lb.mu.Unlock()
	for c := range conns {
		c.Close()
	}
}

// TestReplicasRebalance: two frontend replicas behind a TCP round-robin balancer, with
// --frontend-replicas=2 and the informers' count as --frontend-expected-connections. Every
// informer (a connection each) connects while the second replica is down, so
// the first holds them all; then the second comes up. The first sheds its excess at the
// default rate (a watch ended cleanly, then a 429 and a GOAWAY to its re-watch), the shed
// clients reconnect through the balancer, and within a few minutes neither replica holds more
// than its limit. No informer relists, and each one's events are the writer's changes, none
// lost, none twice.
//
// Over HTTP/2 (TLS) and over HTTP/1.1 (plain), where the shed watch's last chunk closes its
// connection.
func TestReplicasRebalance(t *testing.T) {
	c := newCluster(t, cluster.Options{})
	for _, h2 := range []bool{true, false} {
		name := map[bool]string{true: "http2", false: "http1"}[h2]
		t.Run(name, func(t *testing.T) { replicasRebalance(t, c, h2, resilienceNamespace(t, c, "rebalance-"+name)) })
	}
}

func replicasRebalance(t *testing.T, c *cluster.Cluster, h2 bool, ns string) {
	const informers = 30
	var addrs [2]string
	for i := range addrs {
		p, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		addrs[i] = "127.0.0.1:" + strconv.Itoa(p)
	}
	replica := func(i int) *proxy {
		args := append(resilienceProxyArgs(c, 0), "--listen="+addrs[i],
			"--max-connections-per-source=-1", // behind the balancer every client has its address
			"--frontend-replicas=2", fmt.Sprintf("--frontend-expected-connections=%d", informers))
		if h2 {
			args = append(args, "--tls-cert-file="+filepath.Join(c.Dir, "serving.crt"), "--tls-private-key-file="+filepath.Join(c.Dir, "serving.key"))
		}
		p := startProxy(t, args...)
		waitUpstreamUp(t, p, c.APIServers[0].URL)
		return p
	}
	lb := startRoundRobin(t, addrs[0], addrs[1])
	a := replica(0)
	var via []*countingInformer
	for i := range informers {
		cfg := &rest.Config{Host: "http://" + lb.ln.Addr().String(), BearerToken: c.AdminToken, QPS: 200, Burst: 400,
			// A dialer of its own: client-go would give identical configs one transport,
			// and every informer would share one HTTP/2 connection.
			Dial: (&net.Dialer{Timeout: 5 * time.Second}).DialContext}
		if h2 {
			cfg.Host, cfg.TLSClientConfig = "https://"+lb.ln.Addr().String(), rest.TLSClientConfig{CAData: c.CAData}
		}
		via = append(via, startCountingInformer(t, fmt.Sprintf("informer#%d", i), cfg, ns))
	}
	wr := newRecordingWriter(t, c, ns)
	wr.start(8, 50*time.Millisecond)
	eventually(t, 30*time.Second, "the writer to get going", func() bool { return wr.count() >= 20 })
	main := func(p *proxy) float64 {
		if p == nil {
			return 0
		}
		return p.Metric("watchsan_connections", map[string]string{"listener": "main"})
	}
	eventually(t, 30*time.Second, "every informer's connection on the first replica", func() bool { return main(a) >= informers })
	beforeA := main(a)
	limit := a.Metric("watchsan_connection_rebalance_limit", nil)
	t.Logf("rebalance: before, replica 0 holds %v connections, replica 1 is down; each replica's limit is %v", beforeA, limit)

	b := replica(1)
	up := time.Now()
	even := func() bool {
		na, nb := main(a), main(b)
		return na <= limit && nb <= limit && na+nb >= informers
	}
	eventually(t, 5*time.Minute, "the replicas to even out", even)
	took := time.Since(up)
	afterA, afterB := main(a), main(b)
	t.Logf("rebalance: after %v, replica 0 holds %v connections, replica 1 %v", took.Round(100*time.Millisecond), afterA, afterB)

	finishAndCompare(t, wr, via, nil)
	var relists, rewatches, failures, errs int64
	for _, w := range via {
		relists += w.req.lists.Load() + max(w.req.watchLists.Load()-1, 0)
		rewatches += w.req.rewatches.Load()
		failures += w.req.failures.Load()
		errs += w.errs.Load()
	}
	shed := a.Metric("watchsan_connections_shed_total", map[string]string{"reason": "rebalance"}) +
		b.Metric("watchsan_connections_shed_total", map[string]string{"reason": "rebalance"})
	refused := a.Metric("watchsan_requests_refused_total", map[string]string{"reason": "rebalance"}) +
		b.Metric("watchsan_requests_refused_total", map[string]string{"reason": "rebalance"})
	ended := a.Metric("watchsan_watch_stream_ends_total", map[string]string{"reason": "rebalance"}) +
		b.Metric("watchsan_watch_stream_ends_total", map[string]string{"reason": "rebalance"})
	t.Logf("rebalance: %v connections shed, %v watches ended for it, %v re-watches answered 429; the informers: %d relists, %d re-watches, %d failed requests (the 429s), %d watch errors",
		shed, ended, refused, relists, rewatches, failures, errs)
	if relists != 0 || errs != 0 {
		t.Errorf("the informers relisted %d times and saw %d watch errors, want 0 and 0", relists, errs)
	}
	if shed == 0 {
		t.Error("no connection was shed, yet the replicas evened out: the test did not test shedding")
	}
	for i, p := range []*proxy{a, b} {
		if n := p.Metric("watchsan_watch_relists_forced_total", nil); n != 0 {
			t.Errorf("replica %d told %v clients to relist, want 0", i, n)
		}
	}
}

package upstream

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

// A /readyz answer revives a backend a ping found dead only when its probe was sent since that
// ping began: an answer to a probe sent before (its goroutine late on a loaded machine, or a
// backend that answered it and then froze) says nothing of now. Without the rule a frozen
// backend came back for a round each time a late probe answer was judged.
func TestLateProbeAnswerDoesNotReviveADeadBackend(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	clk := newStepClock()
	roots := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	p := newPool(t, PoolOptions{ProbeTimeout: 5 * time.Second, Transport: TransportOptions{RootCAs: roots},
		Logger: zaptest.NewLogger(t), Clock: clk}, srv.URL)
	b := p.Backends()[0]
	if !b.pingable() {
		t.Fatal("an HTTPS HTTP/2 backend is not pinged")
	}
	ctx := context.Background()

	before := clk.Now().UnixNano()
	clk.Step(time.Second)
	found := clk.Now().UnixNano() // the round whose ping got no answer
	b.hc.deadAt.Store(found)
	b.hc.liveness.Store(livenessDead)
	p.judge(b, nil)
	if b.State() != Unhealthy {
		t.Fatalf("state %s after a dead ping, want unhealthy", b.State())
	}

	p.probe(ctx, b, before) // sent in the round before the freeze, answered (judged) only now
	if b.hc.liveness.Load() != livenessDead || b.State() != Unhealthy {
		t.Fatalf("a probe sent before the dead ping revived the backend: state %s", b.State())
	}
	p.probe(ctx, b, found) // sent with the round that found it dead, and answered: it is back
	if b.hc.liveness.Load() != livenessAlive || b.State() != Healthy {
		t.Fatalf("a probe sent since it was found dead, answered, left it %s", b.State())
	}
}

package server

// Frontend replicas that even out their client connections (docs/design.md section 10.12):
// with --frontend-replicas and --frontend-expected-connections, each main-listener connection
// is in the shedder's set (package shed), which picks the oldest connection above the
// replica's share once a period; shedding it ends each watch on it cleanly
// (watch.Deps.Rebalance) and marks it, so that the next request on it is answered with
// Connection: close (Go's HTTP/2 server sends a graceful GOAWAY for it, as kube-apiserver's
// --goaway-chance filter does; on HTTP/1.1 the connection closes after the response), and a
// watch is refused with the retriable 429 (apistatus.ShuttingDown's reasoning): its client
// watches again from its resourceVersion on a new connection, which the load balancer may
// send to another replica. An HTTP/1.1 watch that took its connection (internal/watch,
// detach.go) closes it after its last chunk, having said Connection: close in its head.

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/apistatus"
	"github.com/watchsan/watchsan/internal/shed"
)

// rebalanceWatchAge: a connection whose youngest watch is younger is not shed. client-go's
// Reflector takes a watch that ended within a second with no event for a broken one ("very
// short watch") and lists again; a watch past this age has at least its age behind it.
const rebalanceWatchAge = 5 * time.Second

// newShedder is the main listener's connection shedder, nil when shedding is off.
func (s *Server) newShedder() *shed.Shedder {
	limit := s.metrics.ConnectionRebalanceLimit
	if !s.cfg.Shedding() {
		limit.Set(0)
		return nil
	}
	counted := s.metrics.ConnectionsShed.WithLabelValues("rebalance")
	log := s.log.Named("shed")
	sh := shed.New(shed.Options{
		Replicas: s.cfg.FrontendReplicas, Expected: s.cfg.FrontendExpectedConnections,
		Slack: shed.DefaultSlack, Floor: shed.DefaultFloor, MinAge: shed.DefaultMinAge,
		Rate: s.cfg.ConnectionShedRate, OnShed: counted.Inc,
		OnPause: func(pause time.Duration, shed, arrived int) {
			log.Warn("shedding connections moved none: as many came in as were shed; paused (another replica is down or full, or --frontend-expected-connections is below the real number)",
				zap.Int("shed", shed), zap.Int("arrived", arrived), zap.Duration("pause", pause))
		},
	})
	limit.Set(float64(sh.Limit()))
	return sh
}

// rebalanceConn is a main-listener connection as the shedder sees it: the watches open on it
// and whether it was shed. Its fields are guarded by mu.
type rebalanceConn struct {
	sh *shed.Shedder
	sc *shed.Conn // its entry in sh, set by openRebalance

	mu sync.Mutex
	// ends holds each open watch's end (watch.Deps.Rebalance), youngest the latest start.
	ends     map[*func()]struct{}
	youngest time.Time
	shed     bool
}

// openRebalance puts a new connection in sh's set; its countedConn closes it.
func openRebalance(sh *shed.Shedder) *rebalanceConn {
	rc := &rebalanceConn{sh: sh, ends: map[*func()]struct{}{}}
	rc.sc = sh.Open(rc.shedNow, rc.ready)
	return rc
}

func (rc *rebalanceConn) close() { rc.sh.Close(rc.sc) }

// ready says whether the connection may be shed at now: it holds a watch (one that holds
// none goes idle and closes on its own, --idle-timeout), none younger than rebalanceWatchAge.
func (rc *rebalanceConn) ready(now time.Time) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.ends) > 0 && now.Sub(rc.youngest) >= rebalanceWatchAge
}

// shedNow marks the connection shed and ends its watches cleanly (the shedder's goroutine).
func (rc *rebalanceConn) shedNow() {
	rc.mu.Lock()
	rc.shed = true
	ends := make([]*func(), 0, len(rc.ends))
	for e := range rc.ends {
		ends = append(ends, e)
	}
	rc.mu.Unlock()
	for _, e := range ends {
		(*e)()
	}
}

// isShed says whether the connection was shed.
func (rc *rebalanceConn) isShed() bool {
	if rc == nil {
		return false
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.shed
}

// rebalanceHook is watch.Deps.Rebalance: rebalanceWatch, or nil when shedding is off.
func (s *Server) rebalanceHook() func(*http.Request, func()) func() {
	if s.shedder == nil {
		return nil
	}
	return rebalanceWatch
}

// rebalanceWatch is watch.Deps.Rebalance: r's watch, begun now, is ended with end when its
// connection is shed (at once if it already was).
func rebalanceWatch(r *http.Request, end func()) (stop func()) {
	rc := rebalanceOf(r)
	if rc == nil {
		return func() {}
	}
	rc.mu.Lock()
	if rc.shed {
		rc.mu.Unlock()
		end()
		return func() {}
	}
	key := &end
	rc.ends[key] = struct{}{}
	rc.youngest = rc.sh.Now() // ready is asked on the shedder's clock
	rc.mu.Unlock()
	return func() {
		rc.mu.Lock()
		delete(rc.ends, key)
		rc.mu.Unlock()
	}
}

// rebalanceOf is the rebalanceConn of r's connection; nil: shedding is off.
func rebalanceOf(r *http.Request) *rebalanceConn {
	cc, _ := r.Context().Value(countedConnKey{}).(*countedConn)
	if cc == nil {
		return nil
	}
	return cc.rebalance
}

// rebalanceRefusal is the answer to a watch on a connection that was shed: 429 with
// Retry-After 1 (apistatus.ShuttingDown says why), sent with Connection: close.
func rebalanceRefusal(limit int) *refusal {
	st := apistatus.New(http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests,
		fmt.Sprintf("watchsan: this replica holds more than its share of the frontend's client connections (%d) and sheds this one; please watch again on a new connection", limit))
	st.Details = &metav1.StatusDetails{RetryAfterSeconds: 1}
	return &refusal{status: st, reason: "rebalance"}
}

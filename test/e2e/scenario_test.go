package e2e

// The real-components scenario: kube-controller-manager, kube-scheduler
// and four hollow nodes (kubemark's kubelet with a fake runtime, tools/kube/hollownode), built
// from the pinned modules, all talking to three apiservers on one etcd, each apiserver with an
// audit log; once through watchsan's HA frontend (TLS, --no-credentials: every client sends its
// own token, the documented HA setup), once directly (every client on apiserver 0, no HA at
// all), and once through haproxy in TCP mode (the kubeadm HA recipe) when haproxy is installed.
// Each mode starts a cluster of its own and runs the same phases, one fault each, with the
// Deployment scaled up at the fault:
//
//	nofault  the scale alone (the Deployment is created), the baseline
//	sigkill  apiserver 0 SIGKILLed and restarted at once (its watch cache starts over)
//	sigstop  apiserver 0 frozen for 15 s (connections stay open; nothing answers)
//	rolling  a rolling restart of all three: SIGTERM (with --shutdown-delay-duration), wait for
//	         the exit, start again, wait until ready, next; a scale at each SIGTERM, the
//	         phase's time the worst of the three
//
// Per phase it measures the seconds from the scale until every pod of the Deployment is
// scheduled and Running (the hollow kubelets report them so), what the apiservers received
// from each client (their audit logs: lists, watch-lists, watches), and, through watchsan, the
// client streams it ended with a 410 (the client relists), its watch moves and any 502 it
// answered. The components run supervised: one that exits (a controller manager or scheduler
// that lost its leader lease does) is started again after a second, as a kubelet restarts a
// static pod, and the restart is reported.
//
//	make scenario                      # or:
//	WATCHSAN_SCENARIO=1 go test ./test/e2e -run '^TestScenario$' -v -timeout 40m
//
// It prints its table; WATCHSAN_SCENARIO_REPORT=path also writes it to a file. The
// issue's "Done when" assertions (no 502; no forced relist in the phases where two apiservers
// could serve every resume point throughout; the controller manager's watch-lists during the
// rolling restart at most direct's; every phase converged within 4 s) fail the test with
// WATCHSAN_ISSUE20_ASSERT=1, as make scenario and make test set it by default
// (ISSUE20_ASSERT ?= 1; the name is historical); without it they only log what they would fail (see issue20Check).

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/test/cluster"
)

const (
	// scenarioNodes is how many hollow nodes run; scenarioStep the pods each phase adds.
	scenarioNodes = 4
	scenarioStep  = 4
	// scenarioConverged is the issue's bound on every phase through watchsan.
	scenarioConverged = 4 * time.Second
	// scenarioGiveUp bounds one convergence: past it the phase is reported as not converged
	// (a direct client pinned to a dead apiserver can take a lease duration and a restart).
	scenarioGiveUp = 3 * time.Minute
	// scenarioFreeze is how long the sigstop phase keeps apiserver 0 frozen.
	scenarioFreeze = 15 * time.Second
	// scenarioQuiet is the time every phase ends with once everything is back, so that what a
	// recovery sets off (rebalancing, re-watches, relists) is counted in its phase.
	scenarioQuiet = 5 * time.Second
	// scenarioNamespace holds the Deployment.
	scenarioNamespace = "scenario"
	// The users of the components (static tokens): the names kubeadm gives them, which the
	// apiserver's bootstrap RBAC binds to their roles.
	kcmUser       = "system:kube-controller-manager"
	schedulerUser = "system:kube-scheduler"
)

// issue20Asserts reports whether the scenario's targets fail the test
// (WATCHSAN_ISSUE20_ASSERT=1, the Makefile's default since the fixes landed);
// without it the scenario measures and logs what the assertions would say
// (TestHAQuietWatchesMove asserts its own always).
func issue20Asserts() bool { return os.Getenv("WATCHSAN_ISSUE20_ASSERT") == "1" }

// issue20Check is one of the scenario's targets: an error when it does not hold
// and issue20Asserts, a log line saying it would fail otherwise.
func issue20Check(t *testing.T, ok bool, format string, args ...any) {
	t.Helper()
	if ok {
		return
	}
	if issue20Asserts() {
		t.Errorf(format, args...)
		return
	}
	t.Logf("target (not asserted until WATCHSAN_ISSUE20_ASSERT=1): "+format, args...)
}

// Client kinds in the audit logs, by user agent.
const (
	clientKCM       = "kcm"
	clientScheduler = "scheduler"
	clientKubelets  = "kubelets"
)

// Request kinds in the audit logs.
const (
	reqList      = "list"
	reqWatchList = "watch-list" // a watch with sendInitialEvents=true: an informer's (re)sync
	reqWatch     = "watch"
)

// scenarioPhase is one phase of one mode, and what it cost.
type scenarioPhase struct {
	name       string
	start, end time.Time
	// converge is the time from the scale's answer until every pod was scheduled and
	// Running; negative if that did not happen within scenarioGiveUp.
	converge time.Duration
	// restarts are the components started again during the phase, by name.
	restarts map[string]int64
	// requests are what the apiservers received in the phase: client kind -> request kind ->
	// count.
	requests map[string]map[string]int
	// watchsan's counters over the phase (watchsan mode only).
	relistsForced, streamsEndedRelist, answered502 float64
	moves                                          map[string]float64
	heldBefore                                     float64 // watchsan's watches on apiserver 0 at the start
	// For the timeline (scenario_timeline_test.go): the faults, and when each scale was
	// answered.
	marks    []timelineEntry
	scaledAt []time.Time
}

// scenarioRun is one mode's run.
type scenarioRun struct {
	mode   string
	phases []*scenarioPhase
	// failures502 are watchsan's access log lines of the 502s it answered.
	failures502 []string
}

func (r *scenarioRun) phase(name string) *scenarioPhase {
	for _, ph := range r.phases {
		if ph.name == name {
			return ph
		}
	}
	return nil
}

// TestScenario runs the scenario in every mode (watchsan, direct, haproxy when installed) and
// prints its table. Only with WATCHSAN_SCENARIO set (make scenario): it takes minutes.
func TestScenario(t *testing.T) {
	if os.Getenv("WATCHSAN_SCENARIO") == "" {
		t.Skip("the real-components scenario runs with WATCHSAN_SCENARIO=1 (make scenario)")
	}
	hollow, err := cluster.Binary("hollow-node")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{cluster.ControllerManager, cluster.Scheduler} {
		if _, err := cluster.Binary(b); err != nil {
			t.Fatal(err)
		}
	}
	modes := []string{"watchsan", "direct"}
	haproxy, _ := exec.LookPath("haproxy")
	if haproxy != "" {
		modes = append(modes, "haproxy")
	} else {
		t.Log("scenario: haproxy is not installed (apt-get install haproxy): no haproxy column")
	}
	if only := os.Getenv("WATCHSAN_SCENARIO_MODES"); only != "" {
		modes = slices.DeleteFunc(modes, func(m string) bool { return !slices.Contains(strings.Split(only, ","), m) })
	}
	var runs []*scenarioRun
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			e := newScenario(t, mode, hollow, haproxy)
			runs = append(runs, e.run())
		})
	}
	report := scenarioReport(runs)
	t.Log("\n" + report)
	if path := os.Getenv("WATCHSAN_SCENARIO_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
			t.Errorf("writing the report: %v", err)
		}
	}
	var ws, direct *scenarioRun
	for _, r := range runs {
		switch r.mode {
		case "watchsan":
			ws = r
		case "direct":
			direct = r
		}
	}
	if ws == nil {
		return
	}
	// The targets, through watchsan.
	var n502 float64
	for _, ph := range ws.phases {
		n502 += ph.answered502
		// In these phases two apiservers run throughout, their watch caches older than any
		// resume point: every one was servable. In the rolling restart each cache starts
		// over in turn, so a resume point older than the last restart may be servable by none
		// (then the 410 is the client's); there the bound is the controller manager's
		// watch-lists against direct's, below.
		if ph.name != "rolling" {
			issue20Check(t, ph.relistsForced == 0, "%s: watchsan ended %v client watches with a 410 (the client relists), want 0: every resume point was servable by a backend",
				ph.name, ph.relistsForced)
		}
		issue20Check(t, ph.converge >= 0 && ph.converge <= scenarioConverged, "%s: the Deployment converged in %s through watchsan, want at most %v",
			ph.name, fmtConverge(ph.converge), scenarioConverged)
	}
	issue20Check(t, n502 == 0, "watchsan answered %v 502s to clients, want none:\n  %s", n502, strings.Join(ws.failures502, "\n  "))
	if direct != nil {
		w, d := ws.phase("rolling").requests[clientKCM][reqWatchList], direct.phase("rolling").requests[clientKCM][reqWatchList]
		issue20Check(t, w <= d, "the controller manager made %d watch-lists during the rolling restart through watchsan, %d directly: want at most direct's", w, d)
	}
}

// scenarioEnv is one mode's cluster, clients and measurements.
type scenarioEnv struct {
	t       *testing.T
	mode    string
	c       *cluster.Cluster
	p       *proxy // watchsan mode
	server  string // what every client talks to
	hollow  string // the hollow-node binary
	kcm     *cluster.Component
	sched   *cluster.Component
	admins  []kubernetes.Interface // the test's own client of each apiserver (admin token)
	down    [3]atomic.Bool         // apiservers the test's client keeps off
	replica int32

	mu       sync.Mutex
	restarts map[string]int64 // components started again, by name
	result   *scenarioRun
	cur      *scenarioPhase // the phase running
}

// newScenario starts the cluster, the mode's frontend and the components, and waits until the
// nodes are Ready.
func newScenario(t *testing.T, mode, hollow, haproxy string) *scenarioEnv {
	users := []cluster.User{{Name: kcmUser}, {Name: schedulerUser}}
	for i := range scenarioNodes {
		users = append(users, cluster.User{Name: "system:node:" + hollowName(i), Groups: []string{"system:nodes"}})
	}
	c := newCluster(t, cluster.Options{
		APIServers: 3,
		Audit:      true,
		Users:      users,
		// A rolling restart's apiserver is unready for 3 s while it still serves, then stops
		// accepting and lets its long-running requests go within the request timeout.
		APIServerFlags: []string{"--shutdown-delay-duration=3s", "--request-timeout=10s"},
	})
	e := &scenarioEnv{t: t, mode: mode, c: c, hollow: hollow, restarts: map[string]int64{}, result: &scenarioRun{mode: mode}}
	for i := range c.APIServers {
		cfg := c.RESTConfig(i, c.AdminToken)
		cfg.Timeout = 5 * time.Second
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		e.admins = append(e.admins, cs)
	}
	e.bootstrap()
	switch mode {
	case "watchsan":
		args := []string{"--tls-cert-file=" + c.ServingCertFile, "--tls-private-key-file=" + c.ServingKeyFile,
			"--no-credentials", "--upstream-ca-file=" + c.CAFile, "--log-level=info"}
		for _, a := range c.APIServers {
			args = append(args, "--upstream="+a.URL)
		}
		e.p = startProxy(t, args...)
		e.server = "https://" + strings.TrimPrefix(e.p.URL, "http://")
		for _, a := range c.APIServers {
			waitUpstreamUp(t, e.p, a.URL)
		}
	case "direct":
		e.server = c.APIServers[0].URL
	case "haproxy":
		e.server = startHAProxyTCP(t, haproxy, c)
	default:
		t.Fatalf("unknown mode %q", mode)
	}

	ctx := ctxT(t, 3*time.Minute)
	var err error
	e.kcm, err = c.StartComponent(ctx, cluster.ControllerManager, cluster.ComponentOptions{
		Server: e.server, Token: c.Tokens[kcmUser],
		// As kubeadm runs it: leader election, and every controller with a service account of
		// its own (tokens requested by the controller manager's own identity).
		Flags: []string{"--leader-elect=true", "--use-service-account-credentials=true"},
	})
	if err != nil {
		t.Fatalf("kube-controller-manager: %v\n%s", err, c.LogTails(40))
	}
	e.sched, err = c.StartComponent(ctx, cluster.Scheduler, cluster.ComponentOptions{
		Server: e.server, Token: c.Tokens[schedulerUser], Flags: []string{"--leader-elect=true"},
	})
	if err != nil {
		t.Fatalf("kube-scheduler: %v\n%s", err, c.LogTails(40))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(stop); wg.Wait() })
	for _, m := range []*cluster.Component{e.kcm, e.sched} {
		wg.Go(func() {
			e.supervise(stop, m.Name, m.Running, func(ctx context.Context) error { return m.Restart(ctx) })
		})
	}
	for i := range scenarioNodes {
		n := e.startHollowNode(i)
		wg.Go(func() { e.supervise(stop, hollowName(i), n.running, n.restart) })
	}
	eventually(t, 2*time.Minute, "every hollow node to be Ready", func() bool {
		nodes, err := e.admin().CoreV1().Nodes().List(ctxT(t, 5*time.Second), metav1.ListOptions{})
		if err != nil {
			return false
		}
		ready := 0
		for _, n := range nodes.Items {
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue && len(n.Spec.Taints) == 0 {
					ready++
				}
			}
		}
		return ready == scenarioNodes
	})
	return e
}

func hollowName(i int) string { return fmt.Sprintf("hollow-%d", i) }

// bootstrap grants the nodes the system:node role (the apiservers run RBAC alone, without the
// Node authorizer) and creates the Deployment's namespace.
func (e *scenarioEnv) bootstrap() {
	ctx := ctxT(e.t, time.Minute)
	cs := e.admins[2]
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "scenario-nodes"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:nodes"}},
	}, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: scenarioNamespace}}, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// hollowNode is one supervised hollow-node process.
type hollowNode struct {
	e    *scenarioEnv
	opts cluster.ProcessOptions
	mu   sync.Mutex
	p    *cluster.Process
}

func (e *scenarioEnv) startHollowNode(i int) *hollowNode {
	name := hollowName(i)
	kubeconfig := filepath.Join(e.c.Dir, name+".kubeconfig")
	if err := e.c.WriteKubeconfig(kubeconfig, e.server, e.c.Tokens["system:node:"+name], e.c.CAFile); err != nil {
		e.t.Fatal(err)
	}
	port, err := freePort()
	if err != nil {
		e.t.Fatal(err)
	}
	n := &hollowNode{e: e, opts: cluster.ProcessOptions{
		Name: name, Path: e.hollow, LogFile: filepath.Join(e.c.Dir, name+".log"),
		Args: []string{"--kubeconfig=" + kubeconfig, "--name=" + name, "--kubelet-port=" + strconv.Itoa(port),
			"--root-dir=" + filepath.Join(e.c.Dir, name)},
	}}
	if err := n.restart(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		n.p.Kill()
		if e.t.Failed() {
			e.t.Logf("%s log tail:\n%s", name, n.p.Tail(30))
		}
	})
	return n
}

func (n *hollowNode) running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return !n.p.Exited()
}

func (n *hollowNode) restart(context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.p != nil {
		n.p.Kill()
	}
	p, err := cluster.StartProcess(n.opts)
	if err != nil {
		return err
	}
	n.p = p
	return nil
}

// supervise starts a component again a second after it exited, until stop, counting restarts.
func (e *scenarioEnv) supervise(stop <-chan struct{}, name string, running func() bool, restart func(context.Context) error) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		if running() {
			continue
		}
		select {
		case <-stop:
			return
		case <-time.After(time.Second):
		}
		e.mu.Lock()
		e.restarts[name]++
		e.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := restart(ctx)
		cancel()
		if err != nil {
			e.t.Logf("scenario %s: restarting %s: %v", e.mode, name, err)
		}
	}
}

// admin is the test's own client of an apiserver the current fault leaves alone.
func (e *scenarioEnv) admin() kubernetes.Interface {
	for i := len(e.admins) - 1; i >= 0; i-- {
		if !e.down[i].Load() {
			return e.admins[i]
		}
	}
	return e.admins[0]
}

// run creates the Deployment, then runs every phase.
func (e *scenarioEnv) run() *scenarioRun {
	t := e.t
	e.phase("nofault", func(scale func() <-chan time.Duration) time.Duration {
		return <-scale()
	})
	a0 := e.c.APIServers[0]
	e.phase("sigkill", func(scale func() <-chan time.Duration) time.Duration {
		e.down[0].Store(true)
		e.mark("SIGKILL apiserver-0")
		if err := a0.Kill(); err != nil {
			t.Fatal(err)
		}
		conv := scale()
		if err := a0.Restart(ctxT(t, 2*time.Minute)); err != nil {
			t.Fatal(err)
		}
		e.mark("apiserver-0 restarted")
		e.down[0].Store(false)
		return <-conv
	})
	e.phase("sigstop", func(scale func() <-chan time.Duration) time.Duration {
		e.down[0].Store(true)
		e.mark("SIGSTOP apiserver-0")
		if err := a0.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a0.Signal(syscall.SIGCONT) })
		conv := scale()
		time.Sleep(scenarioFreeze) // the fault's length, not a wait for something
		e.mark("SIGCONT apiserver-0")
		if err := a0.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if err := a0.Ready(ctxT(t, time.Minute)); err != nil {
			t.Fatal(err)
		}
		e.down[0].Store(false)
		return <-conv
	})
	// One scale per restarted apiserver, each at its SIGTERM; the phase's time is the worst.
	e.phase("rolling", func(scale func() <-chan time.Duration) time.Duration {
		var worst time.Duration
		for i, a := range e.c.APIServers {
			e.down[i].Store(true)
			e.mark(fmt.Sprintf("SIGTERM apiserver-%d", i))
			if err := a.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			conv := scale()
			if err := a.Wait(ctxT(t, 30*time.Second)); err != nil {
				t.Logf("scenario %s: apiserver-%d still draining 30s after SIGTERM: killed", e.mode, i)
			}
			e.mark(fmt.Sprintf("apiserver-%d exited", i))
			if err := a.Restart(ctxT(t, 2*time.Minute)); err != nil {
				t.Fatal(err)
			}
			e.mark(fmt.Sprintf("apiserver-%d restarted", i))
			e.down[i].Store(false)
			if d := <-conv; d < 0 || worst < 0 {
				worst = -1
			} else {
				worst = max(worst, d)
			}
		}
		return worst
	})
	events := e.countRequests()
	for _, ph := range e.result.phases {
		if tl := e.timeline(ph, events); tl != "" {
			t.Log(tl)
		}
	}
	if e.p != nil {
		for _, line := range strings.Split(e.p.Log(), "\n") {
			var m struct {
				Msg, Verb, Path, UserAgent string
				Code                       int
			}
			if json.Unmarshal([]byte(line), &m) == nil && m.Msg == "request" && m.Code == 502 {
				e.result.failures502 = append(e.result.failures502, fmt.Sprintf("%s %s (%s)", m.Verb, m.Path, m.UserAgent))
			}
		}
		// The components' traffic went through watchsan: their watches and their leases.
		if n := e.p.Metric("watchsan_open_watches", nil); n < 20 {
			t.Errorf("watchsan holds %v open watches, want the components' (tens): traffic bypassed the proxy", n)
		}
		e.p.requireProxied(1, map[string]string{"resource": "coordination.k8s.io/leases"})
	}
	return e.result
}

// phase runs one fault: fault gets scale, which adds scenarioStep replicas to the Deployment
// (creating it the first time) and returns where the convergence time will come, and returns
// that time. Then phase waits until everything is back and quiet, and records what the phase
// cost.
func (e *scenarioEnv) phase(name string, fault func(scale func() <-chan time.Duration) time.Duration) {
	t := e.t
	ph := &scenarioPhase{name: name, start: time.Now()}
	e.cur = ph
	restartsBefore := e.restartCounts()
	var before map[string]float64
	if e.p != nil {
		before = e.watchsanCounters()
		ph.heldBefore = e.p.Metric("watchsan_upstream_open_watches", map[string]string{"upstream": e.c.APIServers[0].URL})
	}
	ph.converge = fault(e.scale)
	t.Logf("scenario %s: %s converged in %s", e.mode, name, fmtConverge(ph.converge))
	e.settle()
	ph.end = time.Now()
	ph.restarts = map[string]int64{}
	for k, v := range e.restartCounts() {
		if d := v - restartsBefore[k]; d > 0 {
			ph.restarts[k] = d
		}
	}
	if e.p != nil {
		after := e.watchsanCounters()
		ph.relistsForced = after["relists"] - before["relists"]
		ph.streamsEndedRelist = after["ended"] - before["ended"]
		ph.answered502 = after["502"] - before["502"]
		ph.moves = map[string]float64{}
		for k, v := range after {
			if r, ok := strings.CutPrefix(k, "move:"); ok && v-before[k] > 0 {
				ph.moves[r] = v - before[k]
			}
		}
		if (name == "sigkill" || name == "sigstop") && ph.heldBefore < 1 {
			t.Errorf("%s: watchsan held no watch on apiserver 0 when it was broken: the phase tested nothing", name)
		}
	}
	e.result.phases = append(e.result.phases, ph)
}

func (e *scenarioEnv) restartCounts() map[string]int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string]int64{}
	for k, v := range e.restarts {
		out[k] = v
	}
	return out
}

// watchsanCounters scrapes the counters a phase reports.
func (e *scenarioEnv) watchsanCounters() map[string]float64 {
	out := map[string]float64{
		"relists": e.p.Metric("watchsan_watch_relists_forced_total", nil),
		"ended":   e.p.Metric("watchsan_watch_stream_ends_total", map[string]string{"reason": "relist-forced"}),
		"502":     e.p.Metric("watchsan_requests_total", map[string]string{"code": "502"}),
	}
	for _, r := range []string{"unhealthy", "degraded", "removed", "rebalance", "lagging"} {
		out["move:"+r] = e.p.Metric("watchsan_upstream_watch_moves_total", map[string]string{"reason": r})
	}
	return out
}

// scale adds scenarioStep replicas (creating the Deployment the first time) through the test's
// own client and returns a channel that gets the time from the answer until the Deployment's
// pods are all scheduled and Running, or -1 after scenarioGiveUp.
func (e *scenarioEnv) scale() <-chan time.Duration {
	t := e.t
	e.replica += scenarioStep
	want := e.replica
	eventually(t, time.Minute, fmt.Sprintf("the Deployment scaled to %d", want), func() bool {
		ctx := ctxT(t, 5*time.Second)
		var err error
		if want == scenarioStep {
			_, err = e.admin().AppsV1().Deployments(scenarioNamespace).Create(ctx, scenarioDeployment(want), metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) { // an earlier try's answer was lost
				err = nil
			}
		} else {
			patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, want)
			_, err = e.admin().AppsV1().Deployments(scenarioNamespace).Patch(ctx, "web", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		}
		if err != nil {
			t.Logf("scenario %s: scaling to %d: %v", e.mode, want, err)
		}
		return err == nil
	})
	at := time.Now()
	if e.cur != nil {
		e.cur.scaledAt = append(e.cur.scaledAt, at)
	}
	out := make(chan time.Duration, 1)
	go func() {
		ok := testutil.UntilEvery(scenarioGiveUp, 100*time.Millisecond, func() bool { return e.converged(want) })
		if !ok {
			out <- -1
			return
		}
		out <- time.Since(at)
	}()
	return out
}

// converged reports whether the Deployment has want pods, none going away, all on a node and
// Running.
func (e *scenarioEnv) converged(want int32) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	pods, err := e.admin().CoreV1().Pods(scenarioNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		return false
	}
	running := int32(0)
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Spec.NodeName != "" && p.Status.Phase == corev1.PodRunning {
			running++
		}
	}
	return running == want && int32(len(pods.Items)) == want
}

// settle waits until every apiserver and component is back (and, through watchsan, every
// upstream healthy and the watches spread again), then lets the cluster run scenarioQuiet.
func (e *scenarioEnv) settle() {
	t := e.t
	for _, a := range e.c.APIServers {
		if err := a.Ready(ctxT(t, time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 2*time.Minute, "the controller manager and the scheduler to run", func() bool {
		return e.kcm.Running() && e.sched.Running()
	})
	if e.p != nil {
		for _, a := range e.c.APIServers {
			waitUpstreamUp(t, e.p, a.URL)
		}
		// Rebalancing after a recovery: until the open watches differ by at most a few
		// between upstreams, or 30 s (reported, not failed: the measure is what it cost).
		even := testutil.UntilEvery(30*time.Second, 250*time.Millisecond, func() bool {
			lo, hi := -1.0, 0.0
			for _, a := range e.c.APIServers {
				n := e.p.Metric("watchsan_upstream_open_watches", map[string]string{"upstream": a.URL})
				if lo < 0 || n < lo {
					lo = n
				}
				hi = max(hi, n)
			}
			return hi-lo <= 2
		})
		if !even {
			t.Logf("scenario %s: watches still uneven 30s after the recovery", e.mode)
		}
	}
	time.Sleep(scenarioQuiet) // a measuring window: what the recovery set off lands in this phase
}

// countRequests reads the audit logs and counts every client's lists, watch-lists and watches
// per phase.
func (e *scenarioEnv) countRequests() []auditv1.Event {
	var events []auditv1.Event
	for _, a := range e.c.APIServers {
		evs, err := cluster.ReadAuditLog(a.AuditLog)
		if err != nil {
			e.t.Fatal(err)
		}
		events = append(events, evs...)
	}
	for _, ph := range e.result.phases {
		ph.requests = map[string]map[string]int{}
	}
	seen := 0
	for _, ev := range events {
		client, kind := auditClient(ev), auditKind(ev)
		if client == "" || kind == "" {
			continue
		}
		at := ev.RequestReceivedTimestamp.Time
		for _, ph := range e.result.phases {
			if !at.Before(ph.start) && at.Before(ph.end) {
				if ph.requests[client] == nil {
					ph.requests[client] = map[string]int{}
				}
				ph.requests[client][kind]++
				seen++
			}
		}
	}
	if seen == 0 {
		e.t.Fatalf("the audit logs (%d events) hold no list or watch of the components: the count is broken", len(events))
	}
	return events
}

// auditClient is the component that sent a request, by its user agent ("" for the test's own
// and the apiservers' loopback requests).
func auditClient(ev auditv1.Event) string {
	switch ua := ev.UserAgent; {
	case strings.HasPrefix(ua, "kube-controller-manager/"):
		return clientKCM
	case strings.HasPrefix(ua, "kube-scheduler/"):
		return clientScheduler
	case strings.HasPrefix(ua, "hollow-kubelet"):
		return clientKubelets
	}
	return ""
}

// auditKind is reqList, reqWatchList or reqWatch, "" for other verbs.
func auditKind(ev auditv1.Event) string {
	switch ev.Verb {
	case "list":
		return reqList
	case "watch":
		u, err := url.Parse(ev.RequestURI)
		if err == nil && u.Query().Get("sendInitialEvents") == "true" {
			return reqWatchList
		}
		return reqWatch
	}
	return ""
}

// scenarioDeployment is the Deployment the phases scale: pods a hollow kubelet runs at once.
func scenarioDeployment(replicas int32) *appsv1.Deployment {
	labels := map[string]string{"app": "web"}
	no := false
	grace := int64(1)
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: scenarioNamespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					AutomountServiceAccountToken:  &no,
					EnableServiceLinks:            &no,
					TerminationGracePeriodSeconds: &grace,
					Containers:                    []corev1.Container{{Name: "web", Image: "registry.k8s.io/pause:3.10"}},
				},
			},
		},
	}
}

// startHAProxyTCP runs haproxy in front of the apiservers as kubeadm's HA recipe configures it
// (kubeadm's docs/ha-considerations.md: TCP mode, round robin, /healthz checks over TLS) and
// returns its URL. The serving certificate covers 127.0.0.1, so clients verify it as they would
// verify an apiserver.
func startHAProxyTCP(t *testing.T, bin string, c *cluster.Cluster) string {
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	var servers strings.Builder
	for i, a := range c.APIServers {
		fmt.Fprintf(&servers, "    server apiserver-%d 127.0.0.1:%d check check-ssl verify none\n", i, a.Port)
	}
	cfg := fmt.Sprintf(`global
    log stderr format raw local0 notice
defaults
    mode                    http
    log                     global
    option                  httplog
    option                  dontlognull
    option http-server-close
    option                  redispatch
    retries                 1
    timeout http-request    10s
    timeout queue           20s
    timeout connect         5s
    timeout client          20s
    timeout server          20s
    timeout http-keep-alive 10s
    timeout check           10s
frontend apiserver
    bind 127.0.0.1:%d
    mode tcp
    option tcplog
    default_backend apiserverbackend
backend apiserverbackend
    option httpchk GET /healthz
    http-check expect status 200
    mode tcp
    balance roundrobin
%s`, port, servers.String())
	file := filepath.Join(c.Dir, "haproxy.cfg")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := cluster.StartProcess(cluster.ProcessOptions{Name: "haproxy", Path: bin, Args: []string{"-db", "-f", file},
		LogFile: filepath.Join(c.Dir, "haproxy.log")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	u := "https://127.0.0.1:" + strconv.Itoa(port)
	cfgc := c.RESTConfig(0, c.AdminToken)
	cfgc.Host, cfgc.Timeout = u, 5*time.Second
	cs, err := kubernetes.NewForConfig(cfgc)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "haproxy to forward", func() bool {
		_, err := cs.Discovery().ServerVersion()
		return err == nil && !p.Exited()
	})
	return u
}

// ---- the report ----

func fmtConverge(d time.Duration) string {
	if d < 0 {
		return fmt.Sprintf("> %v", scenarioGiveUp)
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

// scenarioPhaseTitles are the table's rows for the phases, as the issue names them.
var scenarioPhaseTitles = []struct{ name, title string }{
	{"nofault", "no fault (the scale alone)"},
	{"sigkill", "SIGKILL one apiserver"},
	{"sigstop", "SIGSTOP one apiserver, 15 s"},
	{"rolling", "rolling restart of all three"},
}

// scenarioReport is the scenario's table, one column per mode, then every client's requests per
// phase and mode.
func scenarioReport(runs []*scenarioRun) string {
	var b strings.Builder
	b.WriteString("| phase |")
	for _, r := range runs {
		fmt.Fprintf(&b, " %s |", r.mode)
	}
	b.WriteString("\n|---|")
	for range runs {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	row := func(title string, cell func(r *scenarioRun) string) {
		fmt.Fprintf(&b, "| %s |", title)
		for _, r := range runs {
			fmt.Fprintf(&b, " %s |", cell(r))
		}
		b.WriteString("\n")
	}
	for _, pt := range scenarioPhaseTitles {
		row(pt.title, func(r *scenarioRun) string {
			ph := r.phase(pt.name)
			if ph == nil {
				return "—"
			}
			s := fmtConverge(ph.converge)
			if len(ph.restarts) > 0 {
				var names []string
				for k, v := range ph.restarts {
					names = append(names, fmt.Sprintf("%s ×%d", k, v))
				}
				slices.Sort(names)
				s += " (restarted: " + strings.Join(names, ", ") + ")"
			}
			return s
		})
	}
	row("kube-controller-manager's watch-lists (full re-syncs) during the rolling restart", func(r *scenarioRun) string {
		if ph := r.phase("rolling"); ph != nil {
			return strconv.Itoa(ph.requests[clientKCM][reqWatchList])
		}
		return "—"
	})
	row(`client streams watchsan ended with "the client relists" (410)`, func(r *scenarioRun) string {
		if r.mode != "watchsan" {
			return "—"
		}
		var parts []string
		for _, pt := range scenarioPhaseTitles[1:] {
			if ph := r.phase(pt.name); ph != nil {
				s := fmt.Sprintf("%s %v", pt.name, ph.streamsEndedRelist)
				if ph.relistsForced != ph.streamsEndedRelist {
					s += fmt.Sprintf(" (%v 410s sent)", ph.relistsForced)
				}
				parts = append(parts, s)
			}
		}
		return strings.Join(parts, ", ")
	})
	row("all clients' relists (lists + watch-lists, KCM + scheduler + kubelets), rolling restart", func(r *scenarioRun) string {
		ph := r.phase("rolling")
		if ph == nil {
			return "—"
		}
		n := 0
		for _, kinds := range ph.requests {
			n += kinds[reqList] + kinds[reqWatchList]
		}
		return strconv.Itoa(n)
	})
	row("502s answered to clients", func(r *scenarioRun) string {
		if r.mode != "watchsan" {
			return "—"
		}
		var n float64
		for _, ph := range r.phases {
			n += ph.answered502
		}
		return fmt.Sprint(n)
	})
	row("watchsan's watch moves (by reason)", func(r *scenarioRun) string {
		if r.mode != "watchsan" {
			return "—"
		}
		var parts []string
		for _, ph := range r.phases {
			if ph.name == "nofault" {
				continue
			}
			var m []string
			for k, v := range ph.moves {
				m = append(m, fmt.Sprintf("%s %v", k, v))
			}
			slices.Sort(m)
			parts = append(parts, ph.name+": "+strings.Join(m, " "))
		}
		return strings.Join(parts, "; ")
	})

	b.WriteString("\nWhat the apiservers received (audit logs), per phase: lists / watch-lists / watches\n\n")
	b.WriteString("| mode | phase | seconds | kube-controller-manager | kube-scheduler | 4 hollow kubelets |\n|---|---|---|---|---|---|\n")
	for _, r := range runs {
		for _, ph := range r.phases {
			fmt.Fprintf(&b, "| %s | %s | %.0f |", r.mode, ph.name, ph.end.Sub(ph.start).Seconds())
			for _, cl := range []string{clientKCM, clientScheduler, clientKubelets} {
				k := ph.requests[cl]
				fmt.Fprintf(&b, " %d / %d / %d |", k[reqList], k[reqWatchList], k[reqWatch])
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// freePort is a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

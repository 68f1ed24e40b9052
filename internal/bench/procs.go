package bench

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/watchsan/watchsan/internal/config"
)

// PathName names one way from the client to the upstream.
type PathName string

// The paths the bench compares.
const (
	Direct          PathName = "direct"
	Pass            PathName = "pass"
	Decode          PathName = "decode"
	HAProxy         PathName = "haproxy"
	WatchsanRepair  PathName = "watchsan-repair"
	WatchsanObserve PathName = "watchsan-observe"
	// WatchsanShare lends a kubeconfig's token (a sidecar's or a node-local proxy's setup)
	// with --share-watches: identical watches share one upstream watch (docs/design.md
	// section 11). Not in AllPaths: only the lent identity shares, so its clients send no
	// token, and its upstream sees fewer watches than the others'; -paths names it.
	WatchsanShare PathName = "watchsan-share"
	// Frames reads every event with watchsan's stream.Reader and does nothing else (FramesProxy):
	// the floor of an exact proxy. Not in AllPaths; -paths names it.
	Frames PathName = "frames"
)

// AllPaths in report order.
var AllPaths = []PathName{Direct, Pass, Decode, HAProxy, WatchsanRepair, WatchsanObserve}

// knownPaths are the paths -paths may name: AllPaths, WatchsanShare and Frames.
var knownPaths = append(append([]PathName{}, AllPaths...), WatchsanShare, Frames)

// pathDescription is what each path is, for the report.
var pathDescription = map[PathName]string{
	Direct:          "client to the synthetic upstream, no proxy",
	Pass:            "net/http/httputil.ReverseProxy, flush per write (kubectl proxy, kubegateway)",
	Decode:          "apimachinery decode to typed objects + re-encode, flush per event (yurthub, Teleport)",
	HAProxy:         "haproxy in HTTP mode",
	WatchsanRepair:  "watchsan --fix-mode repair",
	WatchsanObserve: "watchsan --fix-mode observe",
	WatchsanShare:   "watchsan --fix-mode repair --share-watches, lending a kubeconfig's token",
	Frames:          "watchsan's stream.Reader alone (scan and parse, batched as watchsan), no decisions",
}

// repairs says whether a path rewrites regressing DELETED events.
func (p PathName) repairs() bool { return p == WatchsanRepair || p == WatchsanShare }

// lends says whether a path lends its own credentials, so that its clients send none.
func (p PathName) lends() bool { return p == WatchsanShare }

// isWatchsan says whether a path is a watchsan process.
func (p PathName) isWatchsan() bool {
	return p == WatchsanRepair || p == WatchsanObserve || p == WatchsanShare
}

// Launcher starts the proxies. Each command is an argv prefix plus extra environment, so that
// the test binary can stand in for the bench binary and for watchsan.
type Launcher struct {
	// Baseline runs the "proxy" subcommand (argv[0] and what precedes the subcommand's flags).
	Baseline    []string
	BaselineEnv []string
	// Watchsan runs watchsan (argv[0] and what precedes its flags).
	Watchsan    []string
	WatchsanEnv []string
	// HAProxy is the haproxy binary; "" when not installed.
	HAProxy string
	// Dir holds configuration files.
	Dir string
	// WatchsanExtra are more flags for watchsan (e.g. --enable-pprof); BaselinePprof gives the
	// baseline proxies a pprof listener (their admin listener).
	WatchsanExtra []string
	BaselinePprof bool
}

// proc is a running proxy process.
type proc struct {
	name  PathName
	cmd   *exec.Cmd
	pid   int
	url   string // main listener, http://host:port (https:// when tls)
	tls   bool   // the main listener serves TLS (watchsan's --tls-cert-file)
	admin string // watchsan's admin listener, http://host:port
	tail  *lineTail
	done  chan struct{}
	temp  string // a file of its own, removed at stop ("" for none)
}

// upstreamSpec is the upstream a proxy forwards to.
type upstreamSpec struct {
	url    string
	caFile string // for https
}

func (l *Launcher) start(ctx context.Context, name PathName, up upstreamSpec) (*proc, error) {
	var argv, env []string
	var temp string
	wantListeners := 1
	switch name {
	case Pass, Decode, Frames:
		argv = append(append([]string{}, l.Baseline...), "--mode", string(name), "--upstream", up.url, "--listen", "127.0.0.1:0")
		if up.caFile != "" {
			argv = append(argv, "--upstream-ca-file", up.caFile)
		}
		if l.BaselinePprof {
			argv = append(argv, "--pprof-listen", "127.0.0.1:0")
			wantListeners = 2
		}
		env = l.BaselineEnv
	case WatchsanRepair, WatchsanObserve, WatchsanShare:
		mode := "repair"
		if name == WatchsanObserve {
			mode = "observe"
		}
		argv = append(append([]string{}, l.Watchsan...), "--upstream", up.url,
			"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--fix-mode", mode, "--log-level", "error",
			"--max-connections", strconv.Itoa(watchsanMaxConn()))
		if name == WatchsanShare {
			kc, err := l.kubeconfig(up)
			if err != nil {
				return nil, err
			}
			temp = kc
			argv = append(argv, "--kubeconfig", kc, "--share-watches", "--allow-credentials-to-upstream", up.url)
		} else {
			// Sharing is on by default; these paths measure one upstream watch per client watch.
			argv = append(argv, "--no-credentials", "--share-watches=false")
		}
		if up.caFile != "" {
			argv = append(argv, "--upstream-ca-file", up.caFile)
		}
		argv = append(argv, l.WatchsanExtra...)
		env = l.WatchsanEnv
		wantListeners = 2
	case HAProxy:
		return l.startHAProxy(ctx, up)
	default:
		return nil, fmt.Errorf("no process for path %s", name)
	}
	p, err := spawn(name, argv, env)
	if err != nil {
		if temp != "" {
			_ = os.Remove(temp)
		}
		return nil, err
	}
	p.temp = temp
	if err := p.ready(ctx, wantListeners); err != nil {
		return nil, err
	}
	return p, nil
}

// ready finds p's listeners and waits until it is ready; on error p is stopped.
func (p *proc) ready(ctx context.Context, listeners int) error {
	if err := p.discover(ctx, listeners); err != nil {
		p.stop()
		return err
	}
	if err := p.waitReady(ctx); err != nil {
		p.stop()
		return err
	}
	return nil
}

func spawn(name PathName, argv, env []string) (*proc, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = io.Discard
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	// Its own process group, so that a signal to the bench's terminal does not race our stop.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, pid: cmd.Process.Pid, tail: newLineTail(40), done: make(chan struct{})}
	go p.tail.consume(stderr)
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// discover finds the listeners: from the "listening" log line when the process logs it (not
// at --log-level error), otherwise from the process's listening sockets in /proc. With two,
// the admin listener is the one whose /metrics has watchsan's own metrics.
// mainScheme is the main listener's URL scheme and separator.
func (p *proc) mainScheme() string {
	if p.tls {
		return "https://"
	}
	return "http://"
}

func (p *proc) discover(ctx context.Context, want int) error {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if l, a := p.tail.listening(); l != "" && (want == 1 || a != "") {
			p.url, p.admin = p.mainScheme()+l, "http://"+a
			if want == 1 {
				p.admin = ""
			}
			return nil
		}
		if addrs, err := procListeners(p.pid); err == nil && len(addrs) == want {
			if want == 1 {
				p.url = p.mainScheme() + addrs[0]
				return nil
			}
			for i, a := range addrs {
				if isWatchsanAdmin("http://" + a) {
					p.admin, p.url = "http://"+a, p.mainScheme()+addrs[1-i]
					return nil
				}
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited at start: %s", p.name, p.tail.String())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s: listeners not found within 20s: %s", p.name, p.tail.String())
}

func isWatchsanAdmin(base string) bool {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(base + "/metrics")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return resp.StatusCode == http.StatusOK && strings.Contains(string(b), "watchsan_")
}

// waitReady waits until /readyz answers 200 through the proxy (and on watchsan's admin
// listener: its upstream is healthy).
func (p *proc) waitReady(ctx context.Context) error {
	c := &http.Client{Timeout: 2 * time.Second}
	if p.tls {
		// Only whether the bench's own child answers on loopback: its certificate is the one
		// the bench made for it (scale.go), checked by the clients that measure.
		c.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	}
	ok := func(u string) bool {
		resp, err := c.Get(u)
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if ok(p.url+"/readyz") && (p.admin == "" || ok(p.admin+"/readyz")) {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited: %s", p.name, p.tail.String())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not ready within 20s: %s", p.name, p.tail.String())
}

// stop ends the process: SIGTERM, then SIGKILL after 3 s.
func (p *proc) stop() {
	if p == nil {
		return
	}
	if p.temp != "" {
		defer os.Remove(p.temp)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(3 * time.Second):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// kubeconfig writes the kubeconfig the share path lends: up's server and CA, and the token
// the other paths' clients send themselves (the bench's upstream takes any).
func (l *Launcher) kubeconfig(up upstreamSpec) (string, error) {
	ca := ""
	if up.caFile != "" {
		ca = "    certificate-authority: " + up.caFile + "\n"
	}
	kc := "apiVersion: v1\nkind: Config\nclusters:\n- name: bench\n  cluster:\n    server: " + up.url + "\n" + ca +
		"users:\n- name: bench\n  user:\n    token: watchsan-bench\n" +
		"contexts:\n- name: bench\n  context:\n    cluster: bench\n    user: bench\ncurrent-context: bench\n"
	f, err := os.CreateTemp(l.Dir, "kubeconfig-*")
	if err != nil {
		return "", fmt.Errorf("the share path's kubeconfig: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString(kc); err != nil {
		return "", fmt.Errorf("the share path's kubeconfig: %w", err)
	}
	return f.Name(), f.Close()
}

func (l *Launcher) startHAProxy(ctx context.Context, up upstreamSpec) (*proc, error) {
	if l.HAProxy == "" {
		return nil, errors.New("haproxy is not installed")
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	host := strings.TrimPrefix(strings.TrimPrefix(up.url, "http://"), "https://")
	server := "server up " + host + " maxconn 100000"
	if strings.HasPrefix(up.url, "https://") {
		server += " ssl verify required ca-file " + up.caFile + " alpn h2"
	}
	// HTTP mode (it parses every request and response and relays the chunked body as it
	// arrives); long client/server timeouts because watches are long; no compression. And the
	// settings anyone proxying watches with haproxy needs:
	//   - http-no-delay: otherwise haproxy sends with MSG_MORE and a lone watch event waits
	//     about 200 ms in the kernel;
	//   - abortonclose: otherwise a watch whose client left is noticed only at the next event
	//     (or after timeout server), so a quiet stream holds both its connections: thousands
	//     of them after a few bench rounds, until maxconn stops haproxy accepting;
	//   - http-reuse always: watches share HTTP/2 upstream connections as Go's transport does
	//     (the default, safe, gives every client connection its own upstream one).
	cfg := fmt.Sprintf(`global
    maxconn %[1]d
    nbthread %[2]d
defaults
    mode http
    timeout connect 5s
    timeout client 10m
    timeout server 10m
    timeout http-request 30s
    option http-no-delay
    http-reuse always
    option abortonclose
    maxconn %[1]d
frontend fe
    bind 127.0.0.1:%[3]d
    default_backend be
backend be
    %[4]s
`, haproxyMaxConn(), max(1, numCPU()), port, server)
	file := fmt.Sprintf("%s/haproxy-%d.cfg", l.Dir, port)
	if err := writeFile(file, []byte(cfg)); err != nil {
		return nil, err
	}
	p, err := spawn(HAProxy, []string{l.HAProxy, "-db", "-f", file}, nil)
	if err != nil {
		return nil, err
	}
	p.url = fmt.Sprintf("http://127.0.0.1:%d", port)
	if err := p.waitReady(ctx); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// haproxyMaxConn is the most connections haproxy can be configured for under the process's file
// descriptor limit: it reserves two per connection (client and server side) and refuses to
// start otherwise.
// watchsanMaxConn is the --max-connections the bench gives watchsan: as many connections as
// its open-file limit (the bench's, passed on) holds, as watchsan itself fits the flag to it
// (config.FitConnections). The default, 1000, would stop the memory runs at 1000 watches.
func watchsanMaxConn() int {
	n, _ := config.FitConnections(1<<20, RaiseFDLimit(0))
	return n
}

func haproxyMaxConn() int {
	return int(min(100000, (RaiseFDLimit(0)-64)/2))
}

// haproxyVersion is the first line of `haproxy -v`.
func haproxyVersion(bin string) string {
	out, err := exec.Command(bin, "-v").Output()
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(line)
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// lineTail keeps the last lines a process wrote, and the listener addresses of its
// "listening" log line.
type lineTail struct {
	mu            sync.Mutex
	lines         []string
	max           int
	listen, admin string
}

func newLineTail(n int) *lineTail { return &lineTail{max: n} }

func (t *lineTail) consume(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var m struct {
			Msg    string `json:"msg"`
			Listen string `json:"listen"`
			Admin  string `json:"admin"`
		}
		t.mu.Lock()
		if strings.Contains(line, `"listening"`) && json.Unmarshal([]byte(line), &m) == nil && m.Msg == "listening" {
			t.listen, t.admin = m.Listen, m.Admin
		}
		t.lines = append(t.lines, line)
		if len(t.lines) > t.max {
			t.lines = t.lines[len(t.lines)-t.max:]
		}
		t.mu.Unlock()
	}
}

func (t *lineTail) listening() (string, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.listen, t.admin
}

func (t *lineTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == 0 {
		return "(no output)"
	}
	return strings.Join(t.lines, "\n")
}

// procListeners lists the TCP addresses pid listens on (IPv4), from its socket inodes and
// /proc/PID/net/tcp.
func procListeners(pid int) ([]string, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, e := range ents {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 || f[3] != "0A" || !inodes[f[9]] {
			continue
		}
		ipHex, portHex, ok := strings.Cut(f[1], ":")
		ip, err1 := hex.DecodeString(ipHex)
		port, err2 := strconv.ParseUint(portHex, 16, 16)
		if !ok || err1 != nil || err2 != nil || len(ip) != 4 {
			continue
		}
		out = append(out, fmt.Sprintf("%d.%d.%d.%d:%d", ip[3], ip[2], ip[1], ip[0], port))
	}
	return out, nil
}

// procCPU is the CPU time (user + system, all threads) pid has used, in seconds.
func procCPU(pid int) (float64, error) {
	user, system, err := procTimes(pid)
	return user + system, err
}

// procTimes is pid's CPU time so far in user space and in the kernel, seconds.
func procTimes(pid int) (user, system float64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(s[i+1:])
	// After the command come state (field 3), ..., utime (14) and stime (15).
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("/proc/%d/stat: bad times", pid)
	}
	return float64(ut) / clockTicks, float64(st) / clockTicks, nil
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

// procStatus reads a "Name: value kB" line of /proc/PID/status, in KiB (or a plain count).
func procStatus(pid int, key string) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				break
			}
			return strconv.ParseInt(f[0], 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, key)
}

// procSyscalls reads pid's read and write system call counts (syscr, syscw of /proc/PID/io:
// read, readv, recvfrom... and write, writev, sendto..., successful or not).
func procSyscalls(pid int) (reads, writes int64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, 0, err
	}
	found := 0
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "syscr" && k != "syscw") {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/io: %s: %w", pid, k, err)
		}
		if k == "syscr" {
			reads = n
		} else {
			writes = n
		}
		found++
	}
	if found != 2 {
		return 0, 0, fmt.Errorf("/proc/%d/io: no syscr and syscw", pid)
	}
	return reads, writes, nil
}

// procFDs counts pid's open file descriptors.
func procFDs(pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(ents)
}

// RaiseFDLimit raises RLIMIT_NOFILE for this process and the processes it starts, to want or
// as far as allowed, and returns the soft limit in force.
func RaiseFDLimit(want uint64) uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	if lim.Cur >= want {
		// Set it anyway: calling Setrlimit makes os/exec pass the limit on to children (Go
		// otherwise restores the limit the process started with).
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
		return lim.Cur
	}
	try := syscall.Rlimit{Cur: want, Max: max(want, lim.Max)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &try); err != nil {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	return lim.Cur
}

func writeFile(name string, data []byte) error { return os.WriteFile(name, data, 0o600) }

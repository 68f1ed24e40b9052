package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// The control-plane components besides the apiservers, started by StartComponent.
const (
	ControllerManager = "kube-controller-manager"
	Scheduler         = "kube-scheduler"
)

// ComponentOptions say how to start kube-controller-manager or kube-scheduler.
type ComponentOptions struct {
	// Server is the URL it talks to; "" means apiserver 0. A watchsan in front of the
	// apiservers, for instance.
	Server string
	// CAFile verifies Server's certificate; "" means the cluster's CA. Ignored for http://.
	CAFile string
	// Token is its bearer token; "" means the cluster's admin token.
	Token string
	// Flags are appended to the harness's own (the last of a single-valued flag wins), e.g.
	// "--controllers=*,-deployment-controller" or "--leader-elect=true".
	Flags []string
}

// Component is a running kube-controller-manager or kube-scheduler of a Cluster, on loopback,
// stopped by Cluster.Stop. Its exported fields are set by StartComponent; do not modify them.
type Component struct {
	// Name is ControllerManager or Scheduler.
	Name string
	// Kubeconfig is the file it reads its server and credentials from.
	Kubeconfig string
	// LogFile holds its output, appended to on every restart.
	LogFile string
	// HealthURL is its /healthz, on a loopback port of its own (self-signed certificate).
	HealthURL string

	c    *Cluster
	bin  string
	args []string
	proc *proc // guarded by c.mu
}

// StartComponent starts kube-controller-manager or kube-scheduler (the binaries `make
// cluster-bins` builds) against the cluster, without leader election unless o.Flags ask for it,
// serving /healthz on loopback, and waits until /healthz answers. The process is killed by
// Stop (or Component.Kill).
func (c *Cluster) StartComponent(ctx context.Context, name string, o ComponentOptions) (*Component, error) {
	if name != ControllerManager && name != Scheduler {
		return nil, fmt.Errorf("cluster: unknown component %q", name)
	}
	bin, err := Binary(name)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	n := len(c.components)
	c.mu.Unlock()
	base := fmt.Sprintf("%s-%d", name, n)
	m := &Component{
		Name:       name,
		Kubeconfig: filepath.Join(c.Dir, base+".kubeconfig"),
		LogFile:    filepath.Join(c.Dir, base+".log"),
		c:          c,
		bin:        bin,
	}
	server, token, ca := o.Server, o.Token, o.CAFile
	if server == "" {
		server = c.APIServers[0].URL
	}
	if token == "" {
		token = c.AdminToken
	}
	if ca == "" {
		ca = c.CAFile
	}
	if len(server) >= 7 && server[:7] == "http://" {
		ca = ""
	}
	if err := c.WriteKubeconfig(m.Kubeconfig, server, token, ca); err != nil {
		return nil, err
	}
	ports, err := c.freePorts(1)
	if err != nil {
		return nil, err
	}
	m.HealthURL = "https://127.0.0.1:" + strconv.Itoa(ports[0]) + "/healthz"
	m.args = []string{
		"--kubeconfig=" + m.Kubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[0]),
		"--cert-dir=" + filepath.Join(c.Dir, base+"-certs"),
	}
	if name == ControllerManager {
		m.args = append(m.args,
			// kube-root-ca.crt in every namespace: the cluster's CA, which signed the apiservers'
			// serving certificate.
			"--root-ca-file="+c.CAFile,
			"--use-service-account-credentials=false",
		)
	}
	m.args = append(m.args, o.Flags...)
	c.mu.Lock()
	c.components = append(c.components, m)
	c.mu.Unlock()
	return m, m.start(ctx)
}

func (m *Component) start(ctx context.Context) error {
	p, err := m.c.startProc(m.Name, m.bin, m.args, m.LogFile, func(p *proc) { m.proc = p })
	if err != nil {
		return err
	}
	return waitReady(ctx, p, m.healthy)
}

// healthy checks /healthz once (always allowed, so no credentials).
func (m *Component) healthy(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.HealthURL, nil)
	if err != nil {
		return err
	}
	resp, err := componentProbe.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%s /healthz: %s: %s", m.Name, resp.Status, body)
	}
	return nil
}

// componentProbe reaches a component's /healthz on loopback; its certificate is self-signed.
var componentProbe = &http.Client{
	Timeout: 5 * time.Second,
	Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, // loopback, a self-signed certificate
		DisableKeepAlives: true,
	},
}

func (m *Component) current() *proc {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	return m.proc
}

// Pid is the process id of the current process.
func (m *Component) Pid() int {
	if p := m.current(); p != nil {
		return p.pid()
	}
	return 0
}

// Running reports whether the current process has not exited.
func (m *Component) Running() bool {
	p := m.current()
	return p != nil && !p.exited()
}

// Signal sends sig to the process; os.ErrProcessDone if it has exited.
func (m *Component) Signal(sig os.Signal) error {
	p := m.current()
	if p == nil {
		return os.ErrProcessDone
	}
	return p.signal(sig)
}

// Kill SIGKILLs the process and waits for it to exit.
func (m *Component) Kill() {
	if p := m.current(); p != nil {
		p.kill()
	}
}

// Restart kills the process if it runs and starts it again with the same flags plus extra (the
// last of a single-valued flag wins), then waits for /healthz. Fails once the cluster is stopped.
func (m *Component) Restart(ctx context.Context, extra ...string) error {
	m.Kill()
	if len(extra) > 0 {
		m.args = append(m.args[:len(m.args):len(m.args)], extra...)
	}
	return m.start(ctx)
}

// Tail returns the last n lines of its current run's log.
func (m *Component) Tail(n int) string {
	if p := m.current(); p != nil {
		return p.tail(n)
	}
	return ""
}

package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// APIServer is one kube-apiserver of a Cluster. It keeps its port across restarts.
type APIServer struct {
	// Index is the position in Cluster.APIServers (and RESTConfig's i).
	Index int
	// URL is https://127.0.0.1:Port.
	URL string
	// Port is the secure port.
	Port int
	// LogFile holds the process's output, appended to on every restart.
	LogFile string
	// Address is the loopback address it binds to and advertises (Options.BindAddresses).
	Address string
	// AuditLog is its audit log with Options.Audit (ReadAuditLog), appended to across
	// restarts; "" without.
	AuditLog string

	c    *Cluster
	proc *proc       // guarded by c.mu
	etcd *pauseProxy // its own way to etcd, with Options.EtcdProxy
}

func (a *APIServer) setPort(port int) {
	a.Port = port
	a.URL = "https://" + net.JoinHostPort(a.Address, strconv.Itoa(port))
}

func (a *APIServer) etcdURL() string {
	if a.etcd != nil {
		return a.etcd.URL()
	}
	return a.c.EtcdURL
}

// PauseEtcd stops forwarding between this apiserver and etcd (Options.EtcdProxy), keeping the
// connections open: the apiserver keeps serving, from a watch cache that no longer advances.
func (a *APIServer) PauseEtcd() error {
	if a.etcd == nil {
		return errors.New(a.name() + ": no etcd proxy (Options.EtcdProxy)")
	}
	a.etcd.Pause()
	return nil
}

// ResumeEtcd forwards between this apiserver and etcd again.
func (a *APIServer) ResumeEtcd() error {
	if a.etcd == nil {
		return errors.New(a.name() + ": no etcd proxy (Options.EtcdProxy)")
	}
	a.etcd.Resume()
	return nil
}

func (a *APIServer) name() string { return "apiserver-" + strconv.Itoa(a.Index) }

func (a *APIServer) current() *proc {
	a.c.mu.Lock()
	defer a.c.mu.Unlock()
	return a.proc
}

func (a *APIServer) args() []string {
	c := a.c
	args := []string{
		"--etcd-servers=" + a.etcdURL(),
		"--etcd-prefix=" + etcdPrefix,
		"--secure-port=" + strconv.Itoa(a.Port),
		"--bind-address=" + a.Address,
		"--advertise-address=" + a.Address,
		"--cert-dir=" + filepath.Join(c.Dir, a.name()),
		"--tls-cert-file=" + c.pki.servingCert,
		"--tls-private-key-file=" + c.pki.servingKey,
		"--client-ca-file=" + c.pki.caPath,
		"--service-account-key-file=" + c.pki.saKey,
		"--service-account-signing-key-file=" + c.pki.saKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--token-auth-file=" + c.tokenFile(),
		"--authorization-mode=RBAC",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--endpoint-reconciler-type=none", // several apiservers, one etcd, no real endpoints
	}
	args = append(args, c.kubeletClientFlags()...) // for the stand-in kubelet (package kubelet)
	args = append(args, c.requestHeaderArgs()...)
	args = append(args, a.auditArgs()...)
	if c.opts.AggregatorProxyClient {
		args = append(args, "--proxy-client-cert-file="+c.FrontProxyCertFile, "--proxy-client-key-file="+c.FrontProxyKeyFile)
	}
	if c.opts.FeatureGates != "" {
		args = append(args, "--feature-gates="+c.opts.FeatureGates)
	}
	return append(args, c.opts.APIServerFlags...)
}

// start starts the process and waits until it is ready. With newPort, a port taken meanwhile
// is replaced by a fresh one; otherwise the same port is tried again for a few seconds.
func (a *APIServer) start(ctx context.Context, newPort bool) error {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		var p *proc
		p, err = a.c.startProc(a.name(), a.c.bins.APIServer, a.args(), a.LogFile, func(p *proc) { a.proc = p })
		if err != nil {
			return err
		}
		err = waitReady(ctx, p, a.ready)
		if err == nil || !p.exited() || !addrInUse(p) {
			return err
		}
		if newPort {
			ports, perr := a.c.freePorts(1)
			if perr != nil {
				return perr
			}
			a.setPort(ports[0])
			continue
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Second):
		}
	}
	return err
}

// ready checks /readyz once, with the admin token.
func (a *APIServer) ready(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.URL+"/readyz", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+a.c.AdminToken)
	resp, err := a.c.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 8192))
		return fmt.Errorf("%s /readyz: %s: %s", a.name(), resp.Status, body)
	}
	return nil
}

// Pid is the process id of the current process (0 before the first start).
func (a *APIServer) Pid() int {
	if p := a.current(); p != nil {
		return p.pid()
	}
	return 0
}

// Running reports whether the current process has not exited.
func (a *APIServer) Running() bool {
	p := a.current()
	return p != nil && !p.exited()
}

// Signal sends sig (e.g. SIGSTOP, SIGCONT, SIGTERM) to the process; os.ErrProcessDone if it
// has exited.
func (a *APIServer) Signal(sig os.Signal) error {
	p := a.current()
	if p == nil {
		return os.ErrProcessDone
	}
	if err := p.signal(sig); err != nil {
		return fmt.Errorf("%s: signal %v: %w", a.name(), sig, err)
	}
	return nil
}

// Kill SIGKILLs the process (stopped or not) and waits for it to exit. Killing an exited
// apiserver does nothing.
func (a *APIServer) Kill() error {
	if p := a.current(); p != nil {
		p.kill()
	}
	return nil
}

// Wait waits until the process has exited (e.g. after SIGTERM), or ctx ends.
func (a *APIServer) Wait(ctx context.Context) error {
	p := a.current()
	if p == nil {
		return nil
	}
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s still running: %w", a.name(), ctx.Err())
	}
}

// Restart starts the apiserver again on the same port with the same flags and waits until it
// is ready (the error then has its log tail). A process still running is SIGKILLed first: to
// restart gracefully, Signal(syscall.SIGTERM) and Wait before. Fails once the cluster is
// stopped.
func (a *APIServer) Restart(ctx context.Context) error {
	if err := a.Kill(); err != nil {
		return err
	}
	return a.start(ctx, false)
}

// Ready polls /readyz with the admin token every 100 ms until it answers 200; it fails at once
// when the process has exited, and when ctx ends.
func (a *APIServer) Ready(ctx context.Context) error {
	p := a.current()
	if p == nil {
		return errors.New(a.name() + " never started")
	}
	return waitReady(ctx, p, a.ready)
}

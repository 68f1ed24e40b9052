package cluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
)

// Process is a process started by StartProcess, for parts of a test cluster that live outside
// this package (a node's container runtime and kubelet, package node): like the control plane's
// own processes, it runs in a process group of its own that the kernel SIGKILLs if this program
// dies (Linux), and its output goes to a log file (appended to) and optionally to a writer.
type Process struct{ p *proc }

// ProcessOptions say how to start a Process.
type ProcessOptions struct {
	// Name prefixes its lines in Log and names it in errors.
	Name string
	// Path and Args are the program and its arguments (without argv[0]).
	Path string
	Args []string
	// Env is its environment; nil means this program's, without the variables that would
	// reconfigure control-plane programs behind the harness's back (ETCD_*, KUBECONFIG).
	Env []string
	// LogFile receives its output, appended to.
	LogFile string
	// Log, if set, also receives its output, each line prefixed with Name.
	Log io.Writer
}

// StartProcess starts a process. It lives until killed (Kill) or until it exits.
func StartProcess(o ProcessOptions) (*Process, error) {
	var extra io.Writer
	if o.Log != nil {
		extra = &prefixWriter{mu: &logMu, w: o.Log, prefix: []byte(o.Name + " | ")}
	}
	p, err := startProc(o.Name, o.Path, o.Args, o.Env, o.LogFile, extra)
	if err != nil {
		return nil, err
	}
	return &Process{p: p}, nil
}

// logMu serializes the lines of Processes sharing a Log writer.
var logMu sync.Mutex

// Pid is its process id.
func (p *Process) Pid() int { return p.p.pid() }

// Done is closed once it has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.p.done }

// Exited reports whether it has exited.
func (p *Process) Exited() bool { return p.p.exited() }

// ExitError is how it exited (nil for status 0); valid once Done is closed.
func (p *Process) ExitError() error { return p.p.err }

// Signal sends sig to the process alone; os.ErrProcessDone once it has exited.
func (p *Process) Signal(sig os.Signal) error { return p.p.signal(sig) }

// SignalGroup sends sig to its whole process group; os.ErrProcessDone once it has exited.
func (p *Process) SignalGroup(sig syscall.Signal) error { return p.p.signalGroup(sig) }

// Kill SIGKILLs its process group and waits until it has exited.
func (p *Process) Kill() { p.p.kill() }

// Wait waits until it has exited, or ctx ends.
func (p *Process) Wait(ctx context.Context) error {
	select {
	case <-p.p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s still running: %w", p.p.name, ctx.Err())
	}
}

// WaitReady polls check every 100 ms until it succeeds, the process exits, or ctx ends; the
// error then carries the tail of its log.
func (p *Process) WaitReady(ctx context.Context, check func(context.Context) error) error {
	return waitReady(ctx, p.p, check)
}

// Tail returns the last n lines this run of the process has logged.
func (p *Process) Tail(n int) string { return p.p.tail(n) }

// Output returns what this run of the process has logged, at most the last 256 KiB.
func (p *Process) Output() string { return p.p.output() }

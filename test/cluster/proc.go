package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one started control-plane process. Its output goes to a log file (appended to across
// restarts) and, optionally, to a shared writer.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFrom int64         // size of the log file when this process started
	done    chan struct{} // closed once the process has exited and been reaped
	err     error         // cmd.Wait's result; read only after done is closed
}

// startProc starts bin in a process group of its own that the kernel kills if this process dies
// (on Linux). It never ties the process to a context: processes live until killed. env is its
// environment; nil means processEnv().
func startProc(name, bin string, args, env []string, logPath string, extra io.Writer) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%s log: %w", name, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s log: %w", name, err)
	}
	p := &proc{name: name, logPath: logPath, logFrom: fi.Size(), done: make(chan struct{})}
	fmt.Fprintf(f, "==== %s %s: %s %s\n", time.Now().Format(time.RFC3339Nano), name, bin, strings.Join(args, " "))

	cmd := exec.Command(bin, args...)
	cmd.Env = env
	if env == nil {
		cmd.Env = processEnv()
	}
	cmd.SysProcAttr = sysProcAttr()
	cmd.WaitDelay = 5 * time.Second
	if extra == nil {
		// The child writes straight into the file: no copying goroutine, and the log survives
		// the death of this process.
		cmd.Stdout, cmd.Stderr = f, f
	} else {
		w := &teeWriter{w: []io.Writer{f, extra}}
		cmd.Stdout, cmd.Stderr = w, w
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p.cmd = cmd
	if extra == nil {
		f.Close() // the child holds its own descriptor
	}
	go func() {
		p.err = cmd.Wait() // returns once the process exits: every path ends by killing it
		if extra != nil {
			f.Close()
		}
		close(p.done)
	}()
	return p, nil
}

// processEnv is this process's environment without variables that would reconfigure the
// children behind the harness's back (etcd reads ETCD_* as flags; kubectl reads KUBECONFIG).
func processEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "ETCD_") || strings.HasPrefix(kv, "KUBECONFIG=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process; os.ErrProcessDone once it has exited.
func (p *proc) signal(sig os.Signal) error {
	if p.exited() {
		return os.ErrProcessDone
	}
	return p.cmd.Process.Signal(sig)
}

// kill SIGKILLs the process group (a stopped process dies too) and waits for the exit.
func (p *proc) kill() {
	if !p.exited() {
		if err := p.signalGroup(syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			_ = p.cmd.Process.Kill()
		}
	}
	<-p.done
}

// signalGroup sends sig to the process's group: the process and what it started that stayed in
// its group (a program run through nsenter, for instance).
func (p *proc) signalGroup(sig syscall.Signal) error {
	if p.exited() {
		return os.ErrProcessDone
	}
	return syscall.Kill(-p.pid(), sig)
}

// output returns what this run of the process has logged, at most the last 256 KiB.
func (p *proc) output() string { return readLog(p.logPath, p.logFrom) }

// readLog returns a log file from offset from on, at most its last 256 KiB; "" if it cannot be
// read.
func readLog(path string, from int64) string {
	const limit = 256 << 10
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() <= from {
		return ""
	}
	from = max(from, fi.Size()-limit)
	b := make([]byte, fi.Size()-from)
	n, _ := f.ReadAt(b, from)
	return string(b[:n])
}

// tail returns the last n lines this run of the process has logged.
func (p *proc) tail(n int) string { return lastLines(p.output(), n) }

func (p *proc) exitError() error {
	if p.err == nil {
		return errors.New("exit status 0")
	}
	return p.err
}

// lastLines returns the last n lines of s (without the final newline).
func lastLines(s string, n int) string {
	if n <= 0 {
		return ""
	}
	s = strings.TrimRight(s, "\n")
	end := len(s)
	for ; n > 0; n-- {
		i := strings.LastIndexByte(s[:end], '\n')
		if i < 0 {
			return s
		}
		end = i
	}
	return s[end+1:]
}

// fileTail returns the last n lines of a file, "" if it cannot be read.
func fileTail(path string, n int) string { return lastLines(readLog(path, 0), n) }

// teeWriter writes to every writer and never fails: a child whose output pipe broke because a
// log sink failed would die of SIGPIPE.
type teeWriter struct{ w []io.Writer }

func (t *teeWriter) Write(b []byte) (int, error) {
	for _, w := range t.w {
		_, _ = w.Write(b)
	}
	return len(b), nil
}

// prefixWriter writes whole lines, each prefixed, to a writer shared (under mu) with the other
// processes of a cluster. A partial line waits for its end.
type prefixWriter struct {
	mu     *sync.Mutex
	w      io.Writer
	prefix []byte
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			break
		}
		line := make([]byte, 0, len(p.prefix)+i+1)
		line = append(append(line, p.prefix...), p.buf[:i+1]...)
		_, _ = p.w.Write(line)
		p.buf = p.buf[i+1:]
	}
	if len(p.buf) == 0 {
		p.buf = nil
	}
	return len(b), nil
}

package cluster

import "syscall"

// sysProcAttr puts a child in a process group of its own (so it can be killed as a group) and
// has the kernel SIGKILL it when the thread that started it dies, so that a crashed or killed
// test binary leaves no control plane behind. (Go threads do not exit while the program runs,
// unless a goroutine exits holding runtime.LockOSThread; do not start clusters from such one.)
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

//go:build unix && !linux

package cluster

import "syscall"

// sysProcAttr puts a child in a process group of its own. Without Linux's parent-death signal,
// a test binary that dies without Stop leaves its processes running.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

package faults

import (
	"net"
	"syscall"
	"time"
	"unsafe"
)

// waitSendQueueEmpty waits until the kernel has no unsent or unacknowledged bytes for c
// (SIOCOUTQ), or timeout passed, so a reset that follows loses nothing already written.
func waitSendQueueEmpty(c *net.TCPConn, timeout time.Duration) {
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	deadline := time.Now().Add(timeout)
	for {
		var n int32
		var errno syscall.Errno
		if err := rc.Control(func(fd uintptr) {
			_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCOUTQ, uintptr(unsafe.Pointer(&n)))
		}); err != nil || errno != 0 || n == 0 || time.Now().After(deadline) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

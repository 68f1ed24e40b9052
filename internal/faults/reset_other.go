//go:build !linux

package faults

import (
	"net"
	"time"
)

// waitSendQueueEmpty cannot look at the send queue here; the reset may lose the last bytes.
func waitSendQueueEmpty(*net.TCPConn, time.Duration) {}

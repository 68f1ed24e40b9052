// Command pause is the test node's sandbox ("pause") image: no registry is reachable here, so
// the node builds its own (package node, with hack/image). Like registry.k8s.io/pause it does
// nothing until SIGTERM or SIGINT, then exits 0; as PID 1 of a pod that shares its process
// namespace it also reaps orphans.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for { // reap every exited child; stop when none is left to reap
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

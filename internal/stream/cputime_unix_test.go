//go:build unix

package stream

import "syscall"

// cpuNanos is the CPU time this process has used so far (user and system, all threads), or 0
// when it cannot be read. Benchmarks report it per op besides wall time: on a shared machine
// it is the steadier measure of what an event costs.
func cpuNanos() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

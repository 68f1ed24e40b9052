//go:build unix

package config

import "syscall"

// nofileLimit is the soft open-file limit (Go raises it to the hard limit at start).
func nofileLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	return uint64(rl.Cur)
}

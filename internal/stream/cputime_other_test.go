//go:build !unix

package stream

func cpuNanos() int64 { return 0 }

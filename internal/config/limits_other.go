//go:build !linux

package config

// cgroupMemoryLimit: only Linux has cgroups.
func cgroupMemoryLimit() int64 { return 0 }

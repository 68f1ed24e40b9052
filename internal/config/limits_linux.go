package config

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// cgroupMemoryLimit reads the memory limit of the process's cgroup, the container's (0: none
// or unknown): cgroup v2's memory.max, else v1's memory.limit_in_bytes. The cgroup is the one
// /proc/self/cgroup names, under /sys/fs/cgroup; with a cgroup namespace (every container
// runtime's default on v2) that path is "/" and the mount's root is the container's own, and
// where the named path is not mounted (v1 without a namespace) the mount's root is tried.
func cgroupMemoryLimit() int64 {
	return memoryLimitUnder("/sys/fs/cgroup", "/proc/self/cgroup")
}

// memoryLimitUnder is cgroupMemoryLimit with the cgroup mount root and the process's cgroup
// file given (tests).
func memoryLimitUnder(root, self string) int64 {
	var v2, v1 string // the cgroup's paths, from self
	if f, err := os.Open(self); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() { // "hierarchy-ID:controllers:path"
			parts := strings.SplitN(sc.Text(), ":", 3)
			if len(parts) != 3 {
				continue
			}
			switch {
			case parts[0] == "0" && parts[1] == "":
				v2 = parts[2]
			case strings.Contains(","+parts[1]+",", ",memory,"):
				v1 = parts[2]
			}
		}
		f.Close()
	}
	for _, p := range []string{
		filepath.Join(root, v2, "memory.max"),
		filepath.Join(root, "memory.max"),
		filepath.Join(root, "memory", v1, "memory.limit_in_bytes"),
		filepath.Join(root, "memory", "memory.limit_in_bytes"),
	} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0
		}
		n, err := strconv.ParseInt(s, 10, 64)
		// v1 says "no limit" with the largest page-aligned int64.
		if err != nil || n <= 0 || n >= 1<<62 {
			return 0
		}
		return n
	}
	return 0
}

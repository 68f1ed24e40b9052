package config

import (
	"os"
	"path/filepath"
	"testing"
)

// The container's memory limit, as cgroup v2 and v1 say it, under a cgroup namespace ("/") and
// without one (the process's path not mounted: the mount's root is the container's).
func TestMemoryLimitFromCgroups(t *testing.T) {
	for _, tc := range []struct {
		name, self string
		files      map[string]string
		want       int64
	}{
		{"v2 namespaced", "0::/\n", map[string]string{"memory.max": "268435456\n"}, 256 << 20},
		{"v2 path", "0::/kubepods/pod1/c1\n", map[string]string{"kubepods/pod1/c1/memory.max": "1073741824\n"}, 1 << 30},
		{"v2 no limit", "0::/\n", map[string]string{"memory.max": "max\n"}, 0},
		{"v1", "4:memory:/docker/abc\n0::/\n", map[string]string{"memory/docker/abc/memory.limit_in_bytes": "536870912\n"}, 512 << 20},
		{"v1 root", "4:memory:/docker/abc\n", map[string]string{"memory/memory.limit_in_bytes": "536870912\n"}, 512 << 20},
		{"v1 no limit", "4:cpu,memory:/\n", map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n"}, 0},
		{"none", "0::/\n", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			self := filepath.Join(root, "self")
			if err := os.WriteFile(self, []byte(tc.self), 0o644); err != nil {
				t.Fatal(err)
			}
			for p, v := range tc.files {
				p = filepath.Join(root, "fs", p)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if got := memoryLimitUnder(filepath.Join(root, "fs"), self); got != tc.want {
				t.Fatalf("memory limit %d, want %d", got, tc.want)
			}
		})
	}
}

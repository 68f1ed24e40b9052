package node

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// runDir is where containerd writes whatever its configuration says: shims put their sockets
// in runDir/s, and the client's FIFOs go to runDir/fifo.
const runDir = "/run/containerd"

// makeSharedMount bind-mounts dir onto itself and makes it a shared mount, so that what the
// kubelet mounts under it (pods' volumes) propagates into the containers' mount namespaces.
func makeSharedMount(dir string) error {
	if err := syscall.Mount(dir, dir, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("node: bind mount %s: %w", dir, err)
	}
	if err := syscall.Mount("", dir, "", syscall.MS_SHARED|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("node: make %s shared: %w", dir, err)
	}
	return nil
}

// cgroupMounts returns the mount points of every cgroup hierarchy (v1 controllers and v2).
func cgroupMounts() ([]string, error) {
	mounts, err := readMountinfo()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range mounts {
		if m.fstype == "cgroup" || m.fstype == "cgroup2" {
			out = append(out, m.point)
		}
	}
	return out, nil
}

// makeCgroups creates the pods' parent cgroup in every hierarchy (the kubelet refuses a
// cgroupRoot that does not exist), with cpuset's cpus and mems copied from the root (a new
// cpuset cgroup has none, and nothing could run in it).
func makeCgroups(root string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	for _, m := range mounts {
		dir := filepath.Join(m, root)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("node: cgroup %s: %w", dir, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(m, f)); err == nil {
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					return fmt.Errorf("node: cgroup %s: %w", filepath.Join(dir, f), err)
				}
			}
		}
	}
	return nil
}

// cgroupDirs returns every directory of the cgroup root in every hierarchy, deepest first.
func cgroupDirs(root string) []string {
	mounts, _ := cgroupMounts()
	var dirs []string
	for _, m := range mounts {
		top := filepath.Join(m, root)
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
	return dirs
}

// killCgroupProcs SIGKILLs every process in the cgroup tree, by process id, until none is
// left (or 10 s pass). A frozen cgroup is thawed first: a frozen process cannot die.
func killCgroupProcs(root string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := 0
		for _, d := range cgroupDirs(root) {
			if st, err := os.ReadFile(filepath.Join(d, "freezer.state")); err == nil && !bytes.HasPrefix(st, []byte("THAWED")) {
				_ = os.WriteFile(filepath.Join(d, "freezer.state"), []byte("THAWED"), 0o644)
			}
			b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
					left++
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		if left == 0 || time.Now().After(deadline) {
			return
		}
		time.Sleep(50 * time.Millisecond) // the kernel reaps asynchronously; poll until empty
	}
}

// killShims SIGKILLs every containerd-shim-runc-v2 started by the containerd at address (its
// command line names the address), by process id. Shims run in sessions of their own, so
// killing containerd's process group does not reach them.
func killShims(address string) {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) == 0 || filepath.Base(args[0]) != "containerd-shim-runc-v2" {
			continue
		}
		for i, a := range args {
			if (a == "-address" || a == "--address") && i+1 < len(args) && args[i+1] == address {
				pids = append(pids, pid)
			}
		}
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range pids {
		for time.Now().Before(deadline) {
			if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
				break
			}
			time.Sleep(20 * time.Millisecond) // reaped by init, not by us: nothing to wait on
		}
	}
}

// removeCgroups removes the cgroup tree in every hierarchy, deepest first.
func removeCgroups(root string) error {
	var errs []error
	for _, d := range cgroupDirs(root) {
		if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("rmdir %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

type mount struct{ point, fstype string }

func readMountinfo() ([]mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source super
		fields := strings.Fields(sc.Text())
		if len(fields) < 7 {
			continue
		}
		m := mount{point: unescapeMount(fields[4])}
		for i, f := range fields {
			if f == "-" && i+1 < len(fields) {
				m.fstype = fields[i+1]
				break
			}
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder unmounts every mount at or under dir, the latest first, detaching them (a
// container's rootfs may still be busy for a moment).
func unmountUnder(dir string) error {
	var errs []error
	for range 5 { // stacked mounts (the bind mount under its shared copy) take a pass each
		mounts, err := readMountinfo()
		if err != nil {
			return err
		}
		var points []string
		for _, m := range mounts {
			if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
				points = append(points, m.point)
			}
		}
		if len(points) == 0 {
			return nil
		}
		errs = errs[:0]
		for i := len(points) - 1; i >= 0; i-- {
			if err := syscall.Unmount(points[i], syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", points[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// cleanRunDir removes what shims and clients left under /run/containerd: sockets no process
// listens on any more (another containerd's live sockets stay), then the directories if empty,
// and /run/containerd itself if it did not exist before the node started.
func cleanRunDir(hadRunDir bool) {
	live := listeningSockets()
	for _, sub := range []string{"s", "fifo"} {
		dir := filepath.Join(runDir, sub)
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			p := filepath.Join(dir, e.Name())
			if e.Type()&os.ModeSocket != 0 && !live[p] {
				_ = os.Remove(p)
			}
		}
		_ = syscall.Rmdir(dir) // fails unless empty
	}
	if !hadRunDir {
		_ = syscall.Rmdir(runDir)
	}
}

// devicePluginDir is where the kubelet's device manager listens whatever its --root-dir
// (k8s.io/kubelet's DevicePluginPath, a constant).
const devicePluginDir = "/var/lib/kubelet/device-plugins"

// cleanDevicePluginDir removes the kubelet's device-plugin socket unless some process still
// listens on it, and the directories up to /var/lib/kubelet if they did not exist before.
func cleanDevicePluginDir(hadDir bool) {
	sock := filepath.Join(devicePluginDir, "kubelet.sock")
	if !listeningSockets()[sock] {
		_ = os.Remove(sock)
	}
	if !hadDir {
		_ = syscall.Rmdir(devicePluginDir)
		_ = syscall.Rmdir(filepath.Dir(devicePluginDir))
	}
}

// listeningSockets returns the paths of the unix sockets bound in this network namespace.
func listeningSockets() map[string]bool {
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		return nil
	}
	live := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) >= 8 && strings.HasPrefix(f[7], "/") {
			live[f[7]] = true
		}
	}
	return live
}

// httpOK GETs url once and wants 200.
func httpOK(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, bytes.TrimSpace(body))
	}
	return nil
}

// kubeletSysctls are the kernel settings the kubelet insists on (pkg/kubelet/cm,
// setupKernelTunables): with protectKernelDefaults it refuses to start unless they have these
// values, without it it writes them, and a shared test machine must not get
// kernel.panic_on_oops=1 from a test.
var kubeletSysctls = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// kubeletSysctlView returns the command that runs the kubelet with args in a mount namespace of
// its own in which each of kubeletSysctls that differs on the host reads as the kubelet wants
// (a file bind-mounted over /proc/sys/...; /proc is made private there first, so nothing of
// it reaches the host). The rest of the mount tree keeps its propagation: the kubelet's root
// directory is a shared mount, so the volumes it mounts there appear on the host, where
// containerd and runc look for them.
func (n *Node) kubeletSysctlView(args []string) (string, []string, error) {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return "", nil, errors.New("node: unshare (util-linux) not found on PATH")
	}
	dir := filepath.Join(n.Dir, "sysctl")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, err
	}
	script := "set -e; mount --make-rprivate /proc"
	keys := make([]string, 0, len(kubeletSysctls))
	for k := range kubeletSysctls {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		want := kubeletSysctls[k]
		proc := "/proc/sys/" + k
		if b, err := os.ReadFile(proc); err == nil && strings.TrimSpace(string(b)) == want {
			continue
		}
		f := filepath.Join(dir, strings.ReplaceAll(k, "/", "."))
		if err := os.WriteFile(f, []byte(want+"\n"), 0o444); err != nil {
			return "", nil, err
		}
		script += "; mount --bind " + shellQuote(f) + " " + proc
	}
	script += `; exec "$0" "$@"`
	all := append([]string{"--mount", "--propagation", "unchanged", "--", "/bin/sh", "-c", script, n.bins.kubelet}, args...)
	return unshare, all, nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

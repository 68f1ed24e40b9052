package node_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/watchsan/watchsan/test/cluster/node"
)

// checkRunning checks one running container of pod against what its spec promises, as the
// kubelet, containerd and runc applied it, read from the host:
//   - /proc/PID/status: the user and group (runAsUser, runAsGroup; not root with runAsNonRoot),
//     NoNewPrivs 1 (allowPrivilegeEscalation: false), Seccomp 2, a filter (seccompProfile
//     RuntimeDefault), no capability in any set (drop ALL);
//   - the root filesystem (readOnlyRootFilesystem): a file created through /proc/PID/root
//     fails with EROFS, and "/" is mounted ro in the container's mount namespace; a file in
//     each writable volume mount is created and removed, so the check can tell the difference;
//   - its cgroup's files: the memory limit (limits.memory), the CPU weight from requests.cpu
//     (cgroup v1 cpu.shares, v2 cpu.weight), and no CFS quota without a CPU limit.
//
// pod must be a fresh copy from the API (its status names the container's ID). It returns a
// summary for the log.
func checkRunning(ctx context.Context, t *testing.T, n *node.Node, pod *corev1.Pod, name string) string {
	t.Helper()
	var c *corev1.Container
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			c = &pod.Spec.InitContainers[i]
		}
	}
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			c = &pod.Spec.Containers[i]
		}
	}
	if c == nil {
		t.Fatalf("pod %s has no container %s", pod.Name, name)
	}
	var id string
	for _, st := range append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...) {
		if st.Name == name && st.State.Running != nil {
			id = st.ContainerID
		}
	}
	if id == "" {
		t.Fatalf("pod %s: container %s is not running: %s", pod.Name, name, statusSummary(pod))
	}
	pid, err := n.ContainerPid(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	where := fmt.Sprintf("pod %s container %s (pid %d)", pod.Name, name, pid)
	sc := c.SecurityContext
	if sc == nil {
		sc = &corev1.SecurityContext{}
	}
	psc := pod.Spec.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}

	status := procStatus(t, pid)
	uid, gid := sc.RunAsUser, sc.RunAsGroup
	if uid == nil {
		uid = psc.RunAsUser
	}
	if gid == nil {
		gid = psc.RunAsGroup
	}
	nonRoot := sc.RunAsNonRoot
	if nonRoot == nil {
		nonRoot = psc.RunAsNonRoot
	}
	ids := func(field string) []string { return strings.Fields(status[field]) }
	for field, want := range map[string]*int64{"Uid": uid, "Gid": gid} {
		got := ids(field)
		if len(got) != 4 {
			t.Errorf("%s: %s: %q", where, field, status[field])
			continue
		}
		for _, g := range got {
			if want != nil && g != strconv.FormatInt(*want, 10) {
				t.Errorf("%s: %s %v, the spec says %d", where, field, got, *want)
				break
			}
			if field == "Uid" && nonRoot != nil && *nonRoot && g == "0" {
				t.Errorf("%s: runs as root (Uid %v) despite runAsNonRoot", where, got)
				break
			}
		}
	}
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation && status["NoNewPrivs"] != "1" {
		t.Errorf("%s: allowPrivilegeEscalation: false, but NoNewPrivs is %q", where, status["NoNewPrivs"])
	}
	seccomp := sc.SeccompProfile
	if seccomp == nil {
		seccomp = psc.SeccompProfile
	}
	if seccomp != nil && seccomp.Type == corev1.SeccompProfileTypeRuntimeDefault && status["Seccomp"] != "2" {
		t.Errorf("%s: seccompProfile RuntimeDefault, but Seccomp is %q (2 is a filter)", where, status["Seccomp"])
	}
	if sc.Capabilities != nil && slices.Contains(sc.Capabilities.Drop, "ALL") && len(sc.Capabilities.Add) == 0 {
		for _, set := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
			if v, err := strconv.ParseUint(status[set], 16, 64); err != nil || v != 0 {
				t.Errorf("%s: capabilities drop ALL, but %s is %q", where, set, status[set])
			}
		}
	}

	// The root filesystem, through the container's own root: the path resolves in its mounts.
	root := fmt.Sprintf("/proc/%d/root", pid)
	probe := ".watchsan-test-write-" + strconv.Itoa(os.Getpid())
	rofs := "writable"
	if sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		err := os.WriteFile(filepath.Join(root, probe), []byte("x"), 0o600)
		switch {
		case err == nil:
			os.Remove(filepath.Join(root, probe))
			t.Errorf("%s: readOnlyRootFilesystem, but a file was created in its root", where)
		case !errors.Is(err, syscall.EROFS):
			t.Errorf("%s: a write into its root failed with %v, want EROFS", where, err)
		default:
			rofs = "read-only (EROFS)"
		}
		if opts := rootMountOptions(t, pid); !slices.Contains(opts, "ro") {
			t.Errorf("%s: readOnlyRootFilesystem, but / is mounted %v", where, opts)
		}
	}
	writable := 0
	for _, m := range c.VolumeMounts {
		if m.ReadOnly {
			continue
		}
		f := filepath.Join(root, m.MountPath, probe)
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Errorf("%s: volume %s at %s is mounted read-write, but a write failed: %v", where, m.Name, m.MountPath, err)
			continue
		}
		os.Remove(f)
		writable++
	}

	cg := checkCgroup(t, where, pid, c.Resources)
	return fmt.Sprintf("%s: uid/gid %s/%s, NoNewPrivs %s, Seccomp %s, CapEff %s CapBnd %s, root %s (%d writable volumes written), %s",
		name, ids("Uid")[0], ids("Gid")[0], status["NoNewPrivs"], status["Seccomp"], status["CapEff"], status["CapBnd"], rofs, writable, cg)
}

// procStatus reads /proc/PID/status into a map of its fields.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// rootMountOptions returns the per-mount options of "/" as the process sees it.
func rootMountOptions(t *testing.T, pid int) []string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	var opts []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && f[4] == "/" {
			opts = strings.Split(f[5], ",") // the last mount on / is the one in effect
		}
	}
	return opts
}

// checkCgroup compares a process's cgroup limits with the container's resources, as the
// kubelet asks runc to set them (MilliCPUToShares: shares = milliCPU*1024/1000, at least 2;
// runc's v2 weight = 1 + (shares-2)*9999/262142).
func checkCgroup(t *testing.T, where string, pid int, res corev1.ResourceRequirements) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	v1 := map[string]string{} // controller -> path
	v2 := ""
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2 = parts[2]
			continue
		}
		for _, ctl := range strings.Split(parts[1], ",") {
			v1[ctl] = parts[2]
		}
	}
	read := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("%s: %v", where, err)
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	var memLimit, cpuWeight, cpuQuota, mode string
	wantShares := int64(2)
	if q, ok := res.Requests[corev1.ResourceCPU]; ok {
		wantShares = max(2, q.MilliValue()*1024/1000)
	}
	var wantWeight string
	if p, ok := v1["memory"]; ok {
		mode = "cgroup v1"
		memLimit = read(filepath.Join("/sys/fs/cgroup/memory", p, "memory.limit_in_bytes"))
		cpuDir := "/sys/fs/cgroup/cpu,cpuacct"
		if _, err := os.Stat(cpuDir); err != nil {
			cpuDir = "/sys/fs/cgroup/cpu"
		}
		cpuWeight = read(filepath.Join(cpuDir, v1["cpu"], "cpu.shares"))
		cpuQuota = read(filepath.Join(cpuDir, v1["cpu"], "cpu.cfs_quota_us"))
		wantWeight = strconv.FormatInt(wantShares, 10)
		if _, limited := res.Limits[corev1.ResourceCPU]; !limited && cpuQuota != "-1" {
			t.Errorf("%s: no CPU limit, but cpu.cfs_quota_us is %s", where, cpuQuota)
		}
	} else if v2 != "" {
		mode = "cgroup v2"
		dir := filepath.Join("/sys/fs/cgroup", v2)
		memLimit = read(filepath.Join(dir, "memory.max"))
		cpuWeight = read(filepath.Join(dir, "cpu.weight"))
		cpuQuota = read(filepath.Join(dir, "cpu.max"))
		wantWeight = strconv.FormatInt(1+(wantShares-2)*9999/262142, 10)
		if _, limited := res.Limits[corev1.ResourceCPU]; !limited && !strings.HasPrefix(cpuQuota, "max") {
			t.Errorf("%s: no CPU limit, but cpu.max is %s", where, cpuQuota)
		}
	} else {
		t.Errorf("%s: /proc/%d/cgroup names no memory controller: %s", where, pid, b)
		return "no cgroup"
	}
	if q, ok := res.Limits[corev1.ResourceMemory]; ok && memLimit != strconv.FormatInt(q.Value(), 10) {
		t.Errorf("%s: memory limit %s (%d bytes), but the cgroup's is %s", where, q.String(), q.Value(), memLimit)
	}
	if cpuWeight != wantWeight {
		t.Errorf("%s: CPU request %s, want CPU weight %s in its cgroup, got %s", where, res.Requests.Cpu(), wantWeight, cpuWeight)
	}
	return fmt.Sprintf("%s: memory limit %s, CPU weight %s, quota %s", mode, memLimit, cpuWeight, cpuQuota)
}

// probeFailures returns how many failed probes of each kind (Startup, Readiness, Liveness)
// the kubelet reported for the container (its Unhealthy events), and fails the test on a
// failed liveness probe: liveness is /healthz only, which an apiserver outage must not fail.
func probeFailures(ctx context.Context, t *testing.T, cs kubernetes.Interface, pod *corev1.Pod, container string) map[string]int32 {
	t.Helper()
	out := probeEvents(ctx, t, cs, pod, container)
	if n := out["Liveness"]; n > 0 {
		t.Errorf("pod %s container %s: its liveness probe failed %d times", pod.Name, container, n)
	}
	return out
}

// probeEvents returns how many failed probes of each kind the kubelet reported for the
// container (its Unhealthy events), and under "Killing" how often it said it would restart it.
func probeEvents(ctx context.Context, t *testing.T, cs kubernetes.Interface, pod *corev1.Pod, container string) map[string]int32 {
	t.Helper()
	evs, err := cs.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.uid=" + string(pod.UID),
	})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int32{}
	for _, e := range evs.Items {
		if !strings.Contains(e.InvolvedObject.FieldPath, "{"+container+"}") {
			continue
		}
		switch e.Reason {
		case "Unhealthy":
			kind, _, _ := strings.Cut(e.Message, " probe")
			out[kind] += max(e.Count, 1)
		case "Killing":
			if strings.Contains(e.Message, "liveness") {
				out["Killing"] += max(e.Count, 1)
			}
		}
	}
	return out
}

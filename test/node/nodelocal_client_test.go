package node_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/watchsan/watchsan/test/cluster"
	"github.com/watchsan/watchsan/test/cluster/node"
	"github.com/watchsan/watchsan/test/cluster/node/nodetest"
)

const (
	cmwatchImage = "watchsan.test/cmwatch:v1"
	cmwatchName  = "cmwatch"
	tickName     = "tick"
)

// buildCmwatch builds ./cmwatch (a client-go informer, see its doc) into an image.
func buildCmwatch(ctx context.Context, t *testing.T) string {
	t.Helper()
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, ".cache", "images", "cmwatch-bin")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	// Built next to the last binary and kept only if it differs: Image reuses its tarball for
	// the same file (path, size, modification time).
	tmp := bin + ".tmp"
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", tmp, "./test/node/cmwatch")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./test/node/cmwatch: %v: %s", err, b)
	}
	if old, err := os.ReadFile(bin); err == nil && string(old) == string(mustRead(t, tmp)) {
		_ = os.Remove(tmp)
	} else if err := os.Rename(tmp, bin); err != nil {
		t.Fatal(err)
	}
	tar, err := node.Image(ctx, node.ImageOptions{Binary: bin, Ref: cmwatchImage, Path: "/cmwatch"})
	if err != nil {
		t.Fatal(err)
	}
	return tar
}

// startCmwatch creates the DaemonSet whose pod (hostNetwork) runs cmwatch against the
// node-local watchsan on 127.0.0.1:listen with its service account (view in default), and
// waits for its informer to have synced. It returns the pod.
func startCmwatch(ctx context.Context, t *testing.T, cs kubernetes.Interface, listen int) *corev1.Pod {
	t.Helper()
	ns := "default"
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: cmwatchName}}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: cmwatchName + "-view"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: cmwatchName, Namespace: ns}},
	}
	if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	grace := int64(2)
	labels := map[string]string{"app": cmwatchName}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: cmwatchName},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					HostNetwork:                   true,
					ServiceAccountName:            cmwatchName,
					TerminationGracePeriodSeconds: &grace,
					Containers: []corev1.Container{{
						Name: "watch", Image: cmwatchImage, ImagePullPolicy: corev1.PullNever,
						// The in-cluster config, its host the node-local watchsan (the pod's own
						// env wins over the service variables the kubelet adds).
						Env: []corev1.EnvVar{
							{Name: "KUBERNETES_SERVICE_HOST", Value: "127.0.0.1"},
							{Name: "KUBERNETES_SERVICE_PORT", Value: strconv.Itoa(listen)},
						},
					}},
				},
			},
		},
	}
	if _, err := cs.AppsV1().DaemonSets(ns).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var pod *corev1.Pod
	if err := nodetest.Poll(pctx, func() error {
		pods, err := cs.CoreV1().Pods(ns).List(pctx, metav1.ListOptions{LabelSelector: "app=" + cmwatchName})
		if err != nil {
			return err
		}
		if len(pods.Items) != 1 {
			return fmt.Errorf("%d pods", len(pods.Items))
		}
		if p := &pods.Items[0]; nodetest.PodReady(p) {
			pod = p
			return nil
		} else {
			return fmt.Errorf("pod %s: %s", p.Name, statusSummary(p))
		}
	}); err != nil {
		t.Fatalf("DaemonSet %s: %v", cmwatchName, err)
	}
	return pod
}

// ticks writes ConfigMap default/tick's data.n = 1, 2, ... every 250 ms straight at the
// apiserver (writes that fail while it is down are retried with the same n), and compares
// with what the DaemonSet's cmwatch logged: the delay of write n is from when it was sent to
// the first line of cmwatch's showing n or later (an informer that relisted delivers only the
// latest).
type ticks struct {
	cs     kubernetes.Interface
	logs   *podLogs
	mu     sync.Mutex
	writes []tickWrite
	done   chan struct{}
	wg     sync.WaitGroup
}

type tickWrite struct {
	n  int
	at time.Time
}

func startTicks(ctx context.Context, t *testing.T, cs kubernetes.Interface, logs *podLogs) *ticks {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: tickName}, Data: map[string]string{"n": "0"}}
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k := &ticks{cs: cs, logs: logs, done: make(chan struct{})}
	k.wg.Go(func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for n := 1; ; {
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			at := time.Now()
			_, err := cs.CoreV1().ConfigMaps("default").Patch(wctx, tickName, "application/merge-patch+json",
				[]byte(fmt.Sprintf(`{"data":{"n":"%d"}}`, n)), metav1.PatchOptions{})
			cancel()
			if err == nil {
				k.mu.Lock()
				k.writes = append(k.writes, tickWrite{n: n, at: at})
				k.mu.Unlock()
				n++
			}
			select {
			case <-k.done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	return k
}

// seen parses cmwatch's lines for the tick ConfigMap: when it showed which n.
func (k *ticks) seen(t *testing.T) []tickWrite {
	var out []tickWrite
	for _, l := range k.logs.read(t, "watch") {
		f := strings.Fields(l.text)
		if len(f) != 4 || f[0] != "cm" || f[1] != tickName {
			continue
		}
		if n, err := strconv.Atoi(f[3]); err == nil {
			out = append(out, tickWrite{n: n, at: l.ts})
		}
	}
	return out
}

// waitCaughtUp waits (within limit) until cmwatch has shown the first write sent from now on,
// and returns that write's delay.
func (k *ticks) waitCaughtUp(ctx context.Context, t *testing.T, limit time.Duration) time.Duration {
	t.Helper()
	now := time.Now()
	pctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last tickWrite
	if err := nodetest.Poll(pctx, func() error {
		k.mu.Lock()
		defer k.mu.Unlock()
		for _, w := range k.writes {
			if !w.at.Before(now) {
				last = w
				return nil
			}
		}
		return fmt.Errorf("no write sent since %s has succeeded yet", now.Format(time.RFC3339Nano))
	}); err != nil {
		t.Fatalf("no tick written: %v", err)
	}
	var d time.Duration
	if err := nodetest.Poll(pctx, func() error {
		for _, s := range k.seen(t) {
			if s.n >= last.n {
				d = s.at.Sub(last.at)
				return nil
			}
		}
		return fmt.Errorf("cmwatch has not shown tick %d", last.n)
	}); err != nil {
		t.Fatalf("the DaemonSet's watcher, through watchsan, did not catch up within %s: %v", limit, err)
	}
	return d
}

// maxDelay is the longest delay of a write sent in [from, to) that cmwatch has shown, and
// that write's n.
func (k *ticks) maxDelay(t *testing.T, from, to time.Time) (time.Duration, int) {
	seen := k.seen(t)
	k.mu.Lock()
	defer k.mu.Unlock()
	var worst time.Duration
	var at int
	for _, w := range k.writes {
		if w.at.Before(from) || !w.at.Before(to) {
			continue
		}
		for _, s := range seen {
			if s.n >= w.n {
				if d := s.at.Sub(w.at); d > worst {
					worst, at = d, w.n
				}
				break
			}
		}
	}
	return worst, at
}

func (k *ticks) stop() {
	close(k.done)
	k.wg.Wait()
}

// watchsanStart is the process_start_time_seconds of the watchsan behind adminURL, 0 if it
// does not answer.
func watchsanStart(ctx context.Context, adminURL string) float64 {
	v, err := metricErr(ctx, adminURL, "process_start_time_seconds")
	if err != nil {
		return 0
	}
	return v
}

// Command hollow-node is kubemark's hollow node, kubelet morph (k8s.io/kubernetes/cmd/kubemark
// with --morph=kubelet): the real kubelet code from the pinned k8s.io/kubernetes, with a fake
// container runtime (k8s.io/cri-client's fake remote runtime), a fake cAdvisor and a stub
// container manager. It registers its Node, heartbeats its Lease, watches its pods and reports
// them Running, as a kubelet does, without running anything.
//
// It differs from kubemark in what a machine shared by several of them needs: kubemark binds
// the kubelet's server to 0.0.0.0 and its healthz to the default port 10248 (each hollow node
// has a pod network namespace of its own there); this one binds the server to --address
// (loopback by default) on --kubelet-port, turns the read-only port and healthz off, and keeps
// its directories and its fake runtime's socket under --root-dir (kubemark's are in /tmp).
// Everything else is kubemark's: its GetHollowKubeletConfig and NewHollowKubelet.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	fakeremote "k8s.io/cri-client/pkg/fake"
	"k8s.io/klog/v2"
	cadvisortest "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubemark"

	remote "k8s.io/cri-client/pkg"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "hollow-node:", err)
		os.Exit(1)
	}
}

func run() error {
	klog.InitFlags(nil)
	var (
		kubeconfig  = flag.String("kubeconfig", "", "kubeconfig of the node's identity (required)")
		name        = flag.String("name", "hollow-node", "the Node's name")
		address     = flag.String("address", "127.0.0.1", "address the kubelet's server binds")
		port        = flag.Int("kubelet-port", 0, "port of the kubelet's server (required)")
		rootDir     = flag.String("root-dir", "", "the kubelet's root directory, its fake runtime's socket too (required)")
		nodeIP      = flag.String("node-ip", "127.0.0.1", "the Node's InternalIP")
		contentType = flag.String("kube-api-content-type", "application/vnd.kubernetes.protobuf", "content type of requests to the apiserver")
		qps         = flag.Float64("kube-api-qps", 10, "client QPS")
		burst       = flag.Int("kube-api-burst", 20, "client burst")
		maxPods     = flag.Int("max-pods", 110, "pods this node accepts")
	)
	flag.Parse()
	if *kubeconfig == "" || *port == 0 || *rootDir == "" {
		return fmt.Errorf("--kubeconfig, --kubelet-port and --root-dir are required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.ContentType, cfg.QPS, cfg.Burst = *contentType, float32(*qps), *burst
	cfg.UserAgent = "hollow-kubelet" // kubemark's
	client, err := clientset.NewForConfig(cfg)
	if err != nil {
		return err
	}

	f, c := kubemark.GetHollowKubeletConfig(&kubemark.HollowKubeletOptions{
		NodeName: *name, KubeletPort: *port, KubeletReadOnlyPort: 0, MaxPods: *maxPods,
		NodeLabels: map[string]string{},
	})
	// kubemark makes its directories under /tmp, for a pod's lifetime; here they go under the
	// root directory, which the caller removes.
	_ = os.RemoveAll(f.RootDirectory)
	f.RootDirectory = *rootDir
	c.StaticPodPath = filepath.Join(*rootDir, "static-pods")
	c.PodLogsDir = filepath.Join(*rootDir, "pod-logs")
	for _, d := range []string{c.StaticPodPath, c.PodLogsDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	f.NodeIP = *nodeIP
	c.Address = *address
	c.HealthzPort = 0

	// kubemark's: the heartbeat client times out at the lesser of the status update frequency
	// and the lease duration, and is not rate limited.
	hb := *cfg
	hb.Timeout = min(c.NodeStatusUpdateFrequency.Duration, time.Duration(c.NodeLeaseDurationSeconds)*time.Second)
	hb.QPS = -1
	heartbeat, err := clientset.NewForConfig(&hb)
	if err != nil {
		return err
	}

	endpoint := "unix://" + filepath.Join(*rootDir, "runtime.sock") // kubemark's is in /tmp
	rt := fakeremote.NewFakeRemoteRuntime()
	if err := rt.Start(endpoint); err != nil {
		return fmt.Errorf("fake runtime: %w", err)
	}
	defer rt.Stop()
	runtimeService, err := remote.NewRemoteRuntimeServiceBuilder().WithEndpoint(endpoint).
		WithConnectionTimeout(15 * time.Second).Build(ctx)
	if err != nil {
		return fmt.Errorf("runtime service: %w", err)
	}
	hk := kubemark.NewHollowKubelet(f, c, client, heartbeat,
		&cadvisortest.Fake{NodeName: *name}, rt.ImageService, runtimeService, cm.NewStubContainerManager())
	go hk.Run(ctx)
	<-ctx.Done()
	return nil
}

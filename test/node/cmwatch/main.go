// Command cmwatch is the node-local test's DaemonSet client (test/node): an
// ordinary client-go informer on the ConfigMaps of its namespace, with the in-cluster config
// (its service account's token and CA; KUBERNETES_SERVICE_HOST/PORT name the node-local
// watchsan), that prints one line per ConfigMap it sees added or changed:
//
//	cm NAME RESOURCEVERSION N
//
// where N is the ConfigMap's data["n"]. The kubelet's timestamp on each line of its log is
// when the informer delivered the change.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "cmwatch:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return err
	}
	ns, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(string(ns)))
	inf := f.Core().V1().ConfigMaps().Informer()
	show := func(obj any) {
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			fmt.Printf("cm %s %s %s\n", cm.Name, cm.ResourceVersion, cm.Data["n"])
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    show,
		UpdateFunc: func(_, obj any) { show(obj) },
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	fmt.Printf("synced via %s\n", cfg.Host)
	<-ctx.Done()
	f.Shutdown()
	return nil
}

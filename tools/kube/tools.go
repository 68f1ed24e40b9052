//go:build tools

// Package tools pins the commands this module builds, so that go mod tidy records everything
// they need: the control plane (kube-apiserver, kube-controller-manager, kube-scheduler),
// kubectl, a node's kubelet and kubemark's hollow node.
package tools

import (
	_ "k8s.io/kubectl/pkg/cmd"
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
	_ "k8s.io/kubernetes/cmd/kubelet/app"
	_ "k8s.io/kubernetes/cmd/kubemark/app"
)

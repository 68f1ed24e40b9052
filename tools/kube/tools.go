//go:build tools

// Package tools pins the commands this module builds, so that go mod tidy records everything
// kube-apiserver and kubectl need.
package tools

import (
	_ "k8s.io/kubectl/pkg/cmd"
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
)

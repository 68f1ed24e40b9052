//go:build tools

// Package tools pins the commands this module builds, so that go mod tidy records everything
// containerd, containerd-shim-runc-v2 and ctr need.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/manager"
	_ "github.com/containerd/containerd/v2/cmd/containerd/builtins"
	_ "github.com/containerd/containerd/v2/cmd/containerd/command"
	_ "github.com/containerd/containerd/v2/cmd/ctr/app"
)

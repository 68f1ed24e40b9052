//go:build tools

// Package tools pins the command this module builds, so that go mod tidy records everything
// the helm CLI needs.
package tools

import (
	_ "helm.sh/helm/v4/pkg/cmd"
)

package node

import (
	"context"
	"path/filepath"

	"github.com/watchsan/watchsan/test/cluster"
)

// ToolboxImageRef is the toolbox image's reference (ToolboxImage).
const ToolboxImageRef = "watchsan.test/toolbox:v1"

// ToolboxImage builds the toolbox image, ToolboxImageRef, from ./toolbox and returns its
// tarball: one static program at /bin/box that, run as "/bin/box serve PORT" by root, serves
// what kubectl exec, attach, port-forward and cp need in a container (see its doc).
func ToolboxImage(ctx context.Context) (string, error) {
	root, err := cluster.RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(root, ".cache", "images", "toolbox-bin")
	if err := goBuild(ctx, root, bin, "./test/cluster/node/toolbox"); err != nil {
		return "", err
	}
	return Image(ctx, ImageOptions{Binary: bin, Ref: ToolboxImageRef, Path: "/bin/box", Title: "box"})
}

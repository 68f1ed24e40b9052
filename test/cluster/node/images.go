package node

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/watchsan/watchsan/test/cluster"
)

// ImageOptions say how to pack a static program into an image with hack/image.
type ImageOptions struct {
	// Binary is the static program (CGO_ENABLED=0, for this machine's architecture).
	Binary string
	// Ref is the image's name and tag, e.g. watchsan.test/kube-controller-manager:v1.37.2.
	Ref string
	// Path is where the program goes in the image, its entrypoint, e.g. /kube-controller-manager.
	Path string
	// Title is the image's title label; "" means the base name of Path.
	Title string
}

// imageMu serializes image builds: they write into one cache.
var imageMu sync.Mutex

// Image packs a static program into a `docker load` tarball with hack/image (the same way as
// watchsan's own image, on the same nonroot base layer: user 65532, CA bundle, /tmp) and
// returns the tarball's path, in the repository's git-ignored .cache/images. A tarball built
// from the same program (path, size and modification time), ref and path is reused.
func Image(ctx context.Context, o ImageOptions) (string, error) {
	imageMu.Lock()
	defer imageMu.Unlock()
	root, err := cluster.RepoRoot()
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(o.Binary)
	if err != nil {
		return "", fmt.Errorf("image %s: %w", o.Ref, err)
	}
	if o.Title == "" {
		o.Title = filepath.Base(o.Path)
	}
	abs, err := filepath.Abs(o.Binary)
	if err != nil {
		return "", err
	}
	h := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%d\x00%d\x00%s\x00%s\x00%s", abs, fi.Size(), fi.ModTime().UnixNano(), o.Ref, o.Path, o.Title)))
	cache := filepath.Join(root, ".cache", "images")
	out := filepath.Join(cache, o.Title+"-"+hex.EncodeToString(h[:8])+".tar")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", err
	}
	layout, err := os.MkdirTemp(cache, "layout-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(layout)
	cmd := exec.CommandContext(ctx, "go", "run", "./hack/image",
		"--out", layout, "--tarball", out+".tmp", "--ref", o.Ref, "--path", o.Path, "--title", o.Title,
		"--version", "test", "--binary", "linux/"+runtime.GOARCH+"="+abs)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("image %s: hack/image: %w: %s", o.Ref, err, strings.TrimSpace(string(b)))
	}
	return out, os.Rename(out+".tmp", out)
}

// PauseImage builds the sandbox image, SandboxImage, from ./pause (a static binary that waits
// for SIGTERM) and returns its tarball.
func PauseImage(ctx context.Context) (string, error) {
	root, err := cluster.RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(root, ".cache", "images", "pause-bin")
	if err := goBuild(ctx, root, bin, "./test/cluster/node/pause"); err != nil {
		return "", err
	}
	return Image(ctx, ImageOptions{Binary: bin, Ref: SandboxImage, Path: "/pause"})
}

// goBuild builds a static program for this machine (go's build cache makes a second build
// cheap; the binary keeps its modification time when nothing changed, so Image reuses its
// tarball).
func goBuild(ctx context.Context, root, out, pkg string) error {
	tmp := out + ".tmp"
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", tmp, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w: %s", pkg, err, strings.TrimSpace(string(b)))
	}
	if same(tmp, out) {
		return os.Remove(tmp)
	}
	return os.Rename(tmp, out)
}

// same reports whether two files have the same contents.
func same(a, b string) bool {
	x, err := os.ReadFile(a)
	if err != nil {
		return false
	}
	y, err := os.ReadFile(b)
	return err == nil && string(x) == string(y)
}

// WatchsanDevImage is the second tag `make image` gives the tarball's image, the reference
// deploy/'s kustomizations name (the Makefile's IMAGE:IMAGE_DEV_TAG).
const WatchsanDevImage = "ghcr.io/watchsan/watchsan:dev"

// WatchsanImage runs the project's `make image` for this machine's platform and returns the
// tarball it writes (bin/image.tar) and the image reference it is tagged with besides
// WatchsanDevImage (the Makefile's IMAGE:VERSION, the commit unless VERSION is set).
func WatchsanImage(ctx context.Context) (tarball, ref string, err error) {
	imageMu.Lock()
	defer imageMu.Unlock()
	root, err := cluster.RepoRoot()
	if err != nil {
		return "", "", err
	}
	cmd := exec.CommandContext(ctx, "make", "image", "IMAGE_PLATFORMS=linux/"+runtime.GOARCH)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("make image: %w: %s", err, strings.TrimSpace(string(b)))
	}
	tarball = filepath.Join(root, "bin", "image.tar")
	tags, err := tarballTags(tarball)
	if err != nil {
		return "", "", err
	}
	if !slices.Contains(tags, WatchsanDevImage) {
		return "", "", fmt.Errorf("%s: tagged %v, not %s", tarball, tags, WatchsanDevImage)
	}
	for _, t := range tags {
		if t != WatchsanDevImage {
			return tarball, t, nil
		}
	}
	return "", "", fmt.Errorf("%s: tagged only %s, not with its version", tarball, WatchsanDevImage)
}

// tarballTags reads the tags of a `docker load` tarball's first image (manifest.json).
func tarballTags(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: no manifest.json", path)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if hdr.Name != "manifest.json" {
			continue
		}
		var m []struct{ RepoTags []string }
		if err := json.NewDecoder(tr).Decode(&m); err != nil {
			return nil, fmt.Errorf("%s: manifest.json: %w", path, err)
		}
		if len(m) == 0 || len(m[0].RepoTags) == 0 {
			return nil, fmt.Errorf("%s: manifest.json names no tag", path)
		}
		return m[0].RepoTags, nil
	}
}

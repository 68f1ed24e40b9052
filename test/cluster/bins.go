package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ModulePath is the module whose go.mod marks the repository root.
const ModulePath = "github.com/watchsan/watchsan"

// BinDirEnv names the environment variable that, when set, points at a directory holding the
// etcd, kube-apiserver and kubectl binaries (and the others Binary finds), instead of the
// repository's build cache.
const BinDirEnv = "WATCHSAN_BIN_DIR"

// Bins are the paths of the control-plane binaries.
type Bins struct {
	Dir       string // the directory they were found in
	Etcd      string
	APIServer string // kube-apiserver
	Kubectl   string
}

// Binaries locates etcd, kube-apiserver and kubectl: in $WATCHSAN_BIN_DIR if set, else in
// <repo root>/.cache/bin/current, where `make cluster-bins` (hack/cluster-bins.sh) puts them.
// The repository root is the nearest directory at or above the working directory whose go.mod
// declares module github.com/watchsan/watchsan. The error says how to build what is missing.
func Binaries() (Bins, error) {
	dir, err := binDir()
	if err != nil {
		return Bins{}, err
	}
	b := Bins{
		Dir:       dir,
		Etcd:      filepath.Join(dir, "etcd"),
		APIServer: filepath.Join(dir, "kube-apiserver"),
		Kubectl:   filepath.Join(dir, "kubectl"),
	}
	if err := checkBinaries(dir, b.Etcd, b.APIServer, b.Kubectl); err != nil {
		return b, err
	}
	return b, nil
}

// Binary returns the path of another program hack/cluster-bins.sh builds into the same place
// as the control plane (kube-controller-manager, kube-scheduler, kubelet, kubemark, containerd,
// containerd-shim-runc-v2, ctr), or an error saying how to build it.
func Binary(name string) (string, error) {
	dir, err := binDir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, name)
	return p, checkBinaries(dir, p)
}

// binDir is $WATCHSAN_BIN_DIR, or the repository's .cache/bin/current.
func binDir() (string, error) {
	if dir := os.Getenv(BinDirEnv); dir != "" {
		return dir, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", fmt.Errorf("locating cluster binaries (set %s or run from the repository): %w", BinDirEnv, err)
	}
	return filepath.Join(root, ".cache", "bin", "current"), nil
}

// checkBinaries fails, naming the build, unless every path is an executable file.
func checkBinaries(dir string, paths ...string) error {
	var missing []string
	for _, p := range paths {
		fi, err := os.Stat(p) // follows the cache's symlinks
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			missing = append(missing, filepath.Base(p))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("cluster binaries missing in %s: %s; build them with `make cluster-bins` "+
			"(hack/cluster-bins.sh, minutes cold, cached after) or point %s at a directory that has them",
			dir, strings.Join(missing, ", "), BinDirEnv)
	}
	return nil
}

// RepoRoot walks up from the working directory to the go.mod of module github.com/watchsan/watchsan
// and returns its directory.
func RepoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for dir := wd; ; {
		if mod, err := moduleOf(filepath.Join(dir, "go.mod")); err == nil && mod == ModulePath {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of module %s at or above %s", ModulePath, wd)
		}
		dir = parent
	}
}

// moduleOf returns the module path declared in a go.mod file.
func moduleOf(gomod string) (string, error) {
	f, err := os.Open(gomod)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.Index(line, "//"); i >= 0 {
			line = line[:i]
		}
		fields := strings.Fields(line)
		if len(fields) == 2 && fields[0] == "module" {
			return strings.Trim(fields[1], "\"`"), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", errors.New("no module line")
}

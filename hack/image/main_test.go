package main

import (
	"archive/tar"
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
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// testVersion is stamped into the binary the tests build.
const testVersion = "v9.8.7-test"

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// watchsanBinary builds cmd/watchsan once, the way `make image` does (static, trimmed, version
// stamped) for this machine's architecture, so the binary taken back out of the image can run.
func watchsanBinary(t *testing.T) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the image is linux-only; its binary can be run back only on linux")
	}
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "watchsan-image-test-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "watchsan")
		cmd := exec.Command("go", "build", "-trimpath",
			"-ldflags", "-X github.com/watchsan/watchsan/internal/cli.Version="+testVersion,
			"-o", binPath, "github.com/watchsan/watchsan/cmd/watchsan")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
		if b, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, b)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

var (
	tinyOnce sync.Once
	tinyPath string
	tinyErr  error
)

// tinyBinary builds, once, a static do-nothing program: a valid image input for the tests that
// do not run watchsan, small enough that compressing it is cheap (under -race, compressing the
// real 50 MB binary takes tens of seconds).
func tinyBinary(t *testing.T) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the image is linux-only")
	}
	tinyOnce.Do(func() {
		dir, err := os.MkdirTemp("", "watchsan-image-tiny-")
		if err != nil {
			tinyErr = err
			return
		}
		src := filepath.Join(dir, "main.go")
		if tinyErr = os.WriteFile(src, []byte("package main\n\nfunc main() {}\n"), 0o644); tinyErr != nil {
			return
		}
		tinyPath = filepath.Join(dir, "tiny")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", tinyPath, src)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
		if b, err := cmd.CombinedOutput(); err != nil {
			tinyErr = fmt.Errorf("go build: %v\n%s", err, b)
		}
	})
	if tinyErr != nil {
		t.Fatal(tinyErr)
	}
	return tinyPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, p := range []string{binPath, tinyPath} {
		if p != "" {
			os.RemoveAll(filepath.Dir(p))
		}
	}
	os.Exit(code)
}

// TestImageLayout builds the layout and the tarball into a temporary directory, reads them back
// with go-containerregistry, checks the config and the files, and runs the binary taken from
// the layer.
func TestImageLayout(t *testing.T) {
	const version = testVersion
	bin := watchsanBinary(t)
	dir := filepath.Join(t.TempDir(), "image")
	tarPath := filepath.Join(t.TempDir(), "image.tar")
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ca := filepath.Join(t.TempDir(), "ca.crt")
	const caData = "-----BEGIN CERTIFICATE-----\nnot really\n-----END CERTIFICATE-----\n"
	if err := os.WriteFile(ca, []byte(caData), 0o644); err != nil {
		t.Fatal(err)
	}
	plat := v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	o := Options{
		Binaries: []Binary{{Platform: plat, Path: bin}},
		Ref:      "ghcr.io/watchsan/watchsan:" + version,
		Version:  version, Revision: "0123456789abcdef", Created: created, CACerts: ca,
		// As `make image` does: the tag deploy/'s overlays name, on the tarball only.
		TarballTags: []string{"dev"},
	}
	if err := Write(dir, tarPath, o); err != nil {
		t.Fatal(err)
	}

	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("index.json has %d manifests, want 1", len(im.Manifests))
	}
	desc := im.Manifests[0]
	if desc.MediaType != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s, want %s", desc.MediaType, types.OCIManifestSchema1)
	}
	if got := desc.Annotations["org.opencontainers.image.ref.name"]; got != version {
		t.Errorf("ref.name annotation %q, want %q", got, version)
	}
	img, err := p.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if mt, _ := img.MediaType(); mt != types.OCIManifestSchema1 {
		t.Errorf("media type %s, want OCI", mt)
	}
	checkImage(t, img, plat, o)
	files := imageFiles(t, img)
	checkFiles(t, files, caData)

	// The binary as the image holds it runs and says the stamped version.
	f := files[BinaryPath]
	exe := filepath.Join(t.TempDir(), "watchsan-from-image")
	if err := os.WriteFile(exe, f.data, os.FileMode(f.hdr.Mode)); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(exe, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("watchsan version (from the image): %v\n%s", err, out)
	}
	if got, want := strings.TrimSpace(string(out)), "watchsan "+version; got != want {
		t.Errorf("watchsan version printed %q, want %q", got, want)
	}
	t.Logf("binary from the image: %q", strings.TrimSpace(string(out)))

	// The docker tarball holds the same image under the tag (as docker media types: a tarball
	// read back says so whatever it was written from).
	timg, err := tarball.ImageFromPath(tarPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkImage(t, timg, plat, o)
	tm, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(tarPath) })
	if err != nil {
		t.Fatal(err)
	}
	wantTags := []string{"ghcr.io/watchsan/watchsan:dev", o.Ref}
	if len(tm) != 1 || !slices.Equal(slices.Sorted(slices.Values(tm[0].RepoTags)), wantTags) {
		t.Errorf("tarball manifest %+v, want one image tagged %v", tm, wantTags)
	}
	t.Logf("image %s: %s", o.Ref, desc.Digest)
}

func checkImage(t *testing.T, img v1.Image, plat v1.Platform, o Options) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if len(c.Entrypoint) != 1 || c.Entrypoint[0] != "/watchsan" {
		t.Errorf("entrypoint %q, want [/watchsan]", c.Entrypoint)
	}
	if len(c.Cmd) != 0 {
		t.Errorf("cmd %q, want none (flags come from the pod spec)", c.Cmd)
	}
	if c.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532", c.User)
	}
	if c.WorkingDir != "/" {
		t.Errorf("working dir %q, want /", c.WorkingDir)
	}
	if cf.OS != plat.OS || cf.Architecture != plat.Architecture {
		t.Errorf("platform %s/%s, want %s/%s", cf.OS, cf.Architecture, plat.OS, plat.Architecture)
	}
	if !cf.Created.Time.Equal(o.Created) {
		t.Errorf("created %v, want %v", cf.Created.Time, o.Created)
	}
	for k, want := range map[string]string{
		"org.opencontainers.image.source":   "https://github.com/watchsan/watchsan",
		"org.opencontainers.image.version":  o.Version,
		"org.opencontainers.image.revision": o.Revision,
		"org.opencontainers.image.licenses": "Apache-2.0",
	} {
		if got := c.Labels[k]; got != want {
			t.Errorf("label %s = %q, want %q", k, got, want)
		}
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 2 || len(cf.RootFS.DiffIDs) != 2 || len(cf.History) != 2 {
		t.Errorf("%d layers, %d diff IDs, %d history entries; want 2 of each", len(layers), len(cf.RootFS.DiffIDs), len(cf.History))
	}
}

type entry struct {
	hdr  *tar.Header
	data []byte
}

// imageFiles reads every layer's tar (no whiteouts are expected) into a map by absolute path.
func imageFiles(t *testing.T, img v1.Image) map[string]entry {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]entry{}
	for _, l := range layers {
		if mt, _ := l.MediaType(); mt != types.OCILayer {
			t.Errorf("layer media type %s, want %s", mt, types.OCILayer)
		}
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files["/"+strings.TrimSuffix(h.Name, "/")] = entry{h, data}
		}
		rc.Close()
	}
	return files
}

func checkFiles(t *testing.T, files map[string]entry, caData string) {
	t.Helper()
	w, ok := files["/watchsan"]
	switch {
	case !ok:
		t.Fatal("no /watchsan in the image")
	case w.hdr.Typeflag != tar.TypeReg:
		t.Errorf("/watchsan is of type %c, want a regular file", w.hdr.Typeflag)
	case w.hdr.Mode != 0o755:
		t.Errorf("/watchsan mode %o, want 755", w.hdr.Mode)
	case w.hdr.Uid != 65532 || w.hdr.Gid != 65532:
		t.Errorf("/watchsan owned by %d:%d, want 65532:65532", w.hdr.Uid, w.hdr.Gid)
	}
	if got := string(files["/etc/ssl/certs/ca-certificates.crt"].data); got != caData {
		t.Errorf("CA bundle in the image %q, want the one given", got)
	}
	if !strings.Contains(string(files["/etc/passwd"].data), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd does not name the nonroot user 65532:\n%s", files["/etc/passwd"].data)
	}
	if tmp := files["/tmp"]; tmp.hdr == nil || tmp.hdr.Typeflag != tar.TypeDir || tmp.hdr.Mode != 0o1777 {
		t.Errorf("/tmp missing or not a world-writable sticky directory")
	}
}

// TestReproducible: the same inputs give the same image, whenever it is built.
func TestReproducible(t *testing.T) {
	o := Options{
		Binaries: []Binary{{Platform: v1.Platform{OS: "linux", Architecture: runtime.GOARCH}, Path: tinyBinary(t)}},
		Ref:      "example.test/watchsan:r", Version: "r", Created: time.Unix(1700000000, 0), CACerts: "",
	}
	var digests []v1.Hash
	for i := range 2 {
		if i > 0 {
			time.Sleep(1100 * time.Millisecond) // a clock that leaked into the image would now differ
		}
		dir := filepath.Join(t.TempDir(), "image")
		if err := Write(dir, "", o); err != nil {
			t.Fatal(err)
		}
		idx, err := layout.ImageIndexFromPath(dir)
		if err != nil {
			t.Fatal(err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, im.Manifests[0].Digest)
	}
	if digests[0] != digests[1] {
		t.Errorf("two builds of the same inputs: %s and %s: the image is not reproducible", digests[0], digests[1])
	}
}

// TestMultiPlatform writes an image index when given more than one platform; each entry names
// its platform and its config says the same. One binary for this machine stands in for both
// entries, under two variants of its architecture (cross-building takes minutes).
func TestMultiPlatform(t *testing.T) {
	bin := tinyBinary(t)
	dir := filepath.Join(t.TempDir(), "image")
	plats := []v1.Platform{
		{OS: "linux", Architecture: runtime.GOARCH},
		{OS: "linux", Architecture: runtime.GOARCH, Variant: "vtest"},
	}
	o := Options{Ref: "example.test/watchsan:multi", Version: "multi"}
	for _, p := range plats {
		o.Binaries = append(o.Binaries, Binary{Platform: p, Path: bin})
	}
	if err := Write(dir, "", o); err != nil {
		t.Fatal(err)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	top, _ := p.ImageIndex()
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 || tm.Manifests[0].MediaType != types.OCIImageIndex {
		t.Fatalf("index.json: %+v, want one image index", tm.Manifests)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != len(plats) {
		t.Fatalf("image index has %d manifests, want %d", len(im.Manifests), len(plats))
	}
	for i, d := range im.Manifests {
		if d.Platform == nil || !d.Platform.Equals(plats[i]) {
			t.Errorf("manifest %d platform %v, want %v", i, d.Platform, plats[i])
			continue
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Architecture != plats[i].Architecture || cf.Variant != plats[i].Variant {
			t.Errorf("manifest %d config says %s/%s, descriptor %v", i, cf.Architecture, cf.Variant, plats[i])
		}
	}
}

// TestRefusesDynamicBinary: a cgo-linked binary would not start on an empty base; the builder
// says so instead of producing an image that fails at run time.
func TestRefusesDynamicBinary(t *testing.T) {
	for _, p := range []string{"/bin/sh", "/usr/bin/env"} {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		_, err := Build(Binary{Platform: v1.Platform{OS: "linux", Architecture: runtime.GOARCH}, Path: p}, Options{Version: "x"})
		if err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
			t.Errorf("Build(%s) = %v, want a refusal of a dynamically linked binary", p, err)
		}
		return
	}
	t.Skip("no dynamically linked binary found to try")
}

// TestRefusesWrongArchitecture: a binary built for one architecture labelled as another would
// fail with "exec format error" on the node.
func TestRefusesWrongArchitecture(t *testing.T) {
	bin := tinyBinary(t)
	other := "arm64"
	if runtime.GOARCH == "arm64" {
		other = "amd64"
	}
	_, err := Build(Binary{Platform: v1.Platform{OS: "linux", Architecture: other}, Path: bin}, Options{Version: "x"})
	if err == nil || !strings.Contains(err.Error(), "platform says "+other) {
		t.Errorf("Build(%s binary as %s) = %v, want an architecture mismatch", runtime.GOARCH, other, err)
	}
}

// TestOtherProgram: the same image around another static program (the tests' node runs
// kube-controller-manager, kubectl and a pause program so): it is the entrypoint at Path, owned
// by 65532, with the title given; a path that is not absolute and clean is refused.
func TestOtherProgram(t *testing.T) {
	o := Options{
		Binaries: []Binary{{Platform: v1.Platform{OS: "linux", Architecture: runtime.GOARCH}, Path: tinyBinary(t)}},
		Ref:      "example.test/pause:1", Version: "1", Path: "/usr/local/bin/pause", Title: "pause",
	}
	img, err := Build(o.Binaries[0], o)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if got := cf.Config.Entrypoint; len(got) != 1 || got[0] != o.Path {
		t.Errorf("entrypoint %q, want [%s]", got, o.Path)
	}
	if got := cf.Config.Labels["org.opencontainers.image.title"]; got != "pause" {
		t.Errorf("title label %q, want pause", got)
	}
	files := imageFiles(t, img)
	if f, ok := files[o.Path]; !ok {
		t.Errorf("no %s in the image", o.Path)
	} else if f.hdr.Mode != 0o755 || f.hdr.Uid != UID {
		t.Errorf("%s in the image: mode %o, uid %d; want 0755, owned by %d", o.Path, f.hdr.Mode, f.hdr.Uid, UID)
	}
	if _, ok := files[BinaryPath]; ok {
		t.Errorf("%s is in an image of another program", BinaryPath)
	}
	for _, bad := range []string{"pause", "/usr/../pause", "/"} {
		o.Path = bad
		if _, err := Build(o.Binaries[0], o); err == nil {
			t.Errorf("Path %q was accepted", bad)
		}
	}
}

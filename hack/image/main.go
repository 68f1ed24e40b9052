// Command image assembles watchsan's container image without a container engine: it takes
// watchsan binaries already built (static, CGO_ENABLED=0) and writes an OCI image layout (a
// directory that skopeo, crane, podman, containerd and `docker buildx imagetools` can read and
// push), and optionally a `docker load` tarball. `make image` runs it.
//
// The image is what the Dockerfile builds on gcr.io/distroless/static-debian12:nonroot, minus
// the base image, which cannot be pulled here: it is built on an empty base (scratch) and carries
// the little a static Go binary needs from distroless, in a layer of its own: the CA bundle (for
// https upstreams) taken from the build machine, /etc/passwd and /etc/group naming the nonroot
// user 65532, a world-writable /tmp and the user's home. A second layer holds /watchsan, owned by
// 65532 and mode 0755. The config runs /watchsan as 65532:65532 in /.
//
// The same way it packs any other static program (--path, --title): the tests' real node runs
// images of its own made so (kube-controller-manager, kubectl, a pause program), since no
// registry is reachable there.
//
// It lives under hack/ so that go-containerregistry never links into the watchsan binary.
package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's fixed shape; the Dockerfile and deploy/ rely on these.
const (
	BinaryPath = "/watchsan"
	UID        = 65532
	GID        = 65532
	User       = "65532:65532"
	WorkingDir = "/"
	// CACertsPath is where Go's crypto/x509 looks first on Linux, and where distroless puts it.
	CACertsPath = "/etc/ssl/certs/ca-certificates.crt"
	// DefaultSource is the org.opencontainers.image.source label.
	DefaultSource = "https://github.com/watchsan/watchsan"
	// License is the org.opencontainers.image.licenses label (SPDX).
	License = "Apache-2.0"
)

// The files distroless's static nonroot image has that matter to a static binary.
const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group = "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"
)

// Binary is one platform's watchsan binary.
type Binary struct {
	Platform v1.Platform
	Path     string
}

// Options say what to build.
type Options struct {
	// Binaries are the static watchsan binaries, one per platform. With one, the layout's
	// index.json names that image; with several, it names an image index of them.
	Binaries []Binary
	// Ref is the image's name with its tag, e.g. ghcr.io/watchsan/watchsan:v0.1.0. The tag is
	// the layout's org.opencontainers.image.ref.name and the tarball's tag.
	Ref string
	// TarballTags are more tags, of Ref's repository, that the tarball's image also carries
	// (`make image`: dev, the tag deploy/'s overlays name). The layout keeps one entry, Ref's,
	// so that `crane push bin/image` and `skopeo copy oci:bin/image` find one image.
	TarballTags []string
	// Version and Revision are the version and revision labels (Revision may be empty).
	Version, Revision string
	// Source is the source label; "" means DefaultSource.
	Source string
	// Path is where the program goes in the image, its entrypoint; "" means BinaryPath.
	Path string
	// Title is the title label; "" means "watchsan".
	Title string
	// Created stamps the config, the history and every file, so that the same inputs give the
	// same digests.
	Created time.Time
	// CACerts is the CA bundle copied to CACertsPath; "" leaves it out (then https upstreams
	// need --upstream-ca-file or a kubeconfig CA, which in-cluster config always has).
	CACerts string
}

func main() {
	var (
		o        Options
		out      string
		tarPath  string
		created  int64
		binaries multiFlag
		tags     multiFlag
	)
	flag.StringVar(&out, "out", "bin/image", "directory to write the OCI image layout to (replaced)")
	flag.StringVar(&tarPath, "tarball", "", "also write a `docker load` tarball of the first platform's image here")
	flag.StringVar(&o.Ref, "ref", "ghcr.io/watchsan/watchsan:dev", "image name and tag")
	flag.StringVar(&o.Version, "version", "dev", "org.opencontainers.image.version label")
	flag.StringVar(&o.Revision, "revision", "", "org.opencontainers.image.revision label (a commit)")
	flag.StringVar(&o.Source, "source", DefaultSource, "org.opencontainers.image.source label")
	flag.StringVar(&o.Path, "path", BinaryPath, "where the program goes in the image (its entrypoint)")
	flag.StringVar(&o.Title, "title", "watchsan", "org.opencontainers.image.title label")
	flag.StringVar(&o.CACerts, "ca-certs", CACertsPath, "CA bundle to include at "+CACertsPath+" (\"\": none)")
	flag.Int64Var(&created, "created", sourceDateEpoch(), "creation time, Unix seconds (default $SOURCE_DATE_EPOCH or 0)")
	flag.Var(&binaries, "binary", "OS/ARCH[/VARIANT]=PATH of a static watchsan binary (repeatable)")
	flag.Var(&tags, "tarball-tag", "another tag, of --ref's repository, for the tarball's image (repeatable)")
	flag.Parse()
	o.TarballTags = tags
	o.Created = time.Unix(created, 0).UTC()
	for _, b := range binaries {
		plat, file, ok := strings.Cut(b, "=")
		if !ok {
			fail(fmt.Errorf("--binary %q: want OS/ARCH=PATH", b))
		}
		p, err := v1.ParsePlatform(plat)
		if err != nil {
			fail(fmt.Errorf("--binary %q: %w", b, err))
		}
		o.Binaries = append(o.Binaries, Binary{Platform: *p, Path: file})
	}
	if err := Write(out, tarPath, o); err != nil {
		fail(err)
	}
	fmt.Printf("wrote %s (OCI image layout) for %s", out, o.Ref)
	if tarPath != "" {
		fmt.Printf(", %s (docker load)", tarPath)
		for _, t := range o.TarballTags {
			fmt.Printf(" also tagged %s", t)
		}
	}
	fmt.Println()
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "image:", err)
	os.Exit(1)
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func sourceDateEpoch() int64 {
	n, _ := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64)
	return n
}

// Write builds the image(s) and writes the OCI layout to dir (removing what was there) and, if
// tarPath is not "", a docker tarball of the first binary's image.
func Write(dir, tarPath string, o Options) error {
	tag, err := name.NewTag(o.Ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("--ref %q: %w", o.Ref, err)
	}
	if len(o.Binaries) == 0 {
		return errors.New("no --binary given")
	}
	refs := map[string]name.Reference{tag.String(): tag}
	for _, t := range o.TarballTags {
		other, err := name.NewTag(tag.Repository.Name()+":"+t, name.StrictValidation)
		if err != nil {
			return fmt.Errorf("--tarball-tag %q: %w", t, err)
		}
		refs[other.String()] = other
	}
	var imgs []v1.Image
	for _, b := range o.Binaries {
		img, err := Build(b, o)
		if err != nil {
			return err
		}
		imgs = append(imgs, img)
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	ann := layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag.TagStr(),
		"io.containerd.image.name":          tag.Name(),
	})
	if len(imgs) == 1 {
		err = p.AppendImage(imgs[0], ann)
	} else {
		var adds []mutate.IndexAddendum
		for i, img := range imgs {
			plat := o.Binaries[i].Platform
			adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &plat}})
		}
		idx := mutate.IndexMediaType(mutate.AppendManifests(empty.Index, adds...), types.OCIImageIndex)
		idx = mutate.Annotations(idx, labels(o)).(v1.ImageIndex)
		err = p.AppendIndex(idx, ann)
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", dir, err)
	}
	if tarPath != "" {
		refToImage := map[name.Reference]v1.Image{}
		for _, r := range refs {
			refToImage[r] = imgs[0]
		}
		if err := tarball.MultiRefWriteToFile(tarPath, refToImage); err != nil {
			return fmt.Errorf("writing %s: %w", tarPath, err)
		}
	}
	return nil
}

// Build makes one platform's image from its binary.
func Build(b Binary, o Options) (v1.Image, error) {
	if b.Platform.OS != "linux" {
		return nil, fmt.Errorf("%s: only linux images", b.Platform)
	}
	bin, err := os.ReadFile(b.Path)
	if err != nil {
		return nil, err
	}
	if err := checkStatic(bin, b.Platform.Architecture); err != nil {
		return nil, fmt.Errorf("%s: %w", b.Path, err)
	}
	baseFiles := []file{
		{name: "etc/", mode: 0o755 | modeDir},
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		{name: "home/", mode: 0o755 | modeDir},
		{name: "home/nonroot/", mode: 0o700 | modeDir, uid: UID, gid: GID},
		{name: "tmp/", mode: 0o1777 | modeDir},
	}
	if o.CACerts != "" {
		certs, err := os.ReadFile(o.CACerts)
		if err != nil {
			return nil, fmt.Errorf("CA bundle: %w (pass --ca-certs= to build without one)", err)
		}
		baseFiles = append(baseFiles,
			file{name: "etc/ssl/", mode: 0o755 | modeDir},
			file{name: "etc/ssl/certs/", mode: 0o755 | modeDir},
			file{name: strings.TrimPrefix(CACertsPath, "/"), mode: 0o644, data: certs})
	}
	base, err := layer(baseFiles, o.Created)
	if err != nil {
		return nil, err
	}
	entry := o.Path
	if entry == "" {
		entry = BinaryPath
	}
	if !path.IsAbs(entry) || path.Clean(entry) != entry || entry == "/" {
		return nil, fmt.Errorf("path %q: want an absolute, clean file path", entry)
	}
	app, err := layer([]file{{name: strings.TrimPrefix(entry, "/"), mode: 0o755, uid: UID, gid: GID, data: bin}}, o.Created)
	if err != nil {
		return nil, err
	}
	created := v1.Time{Time: o.Created}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, MediaType: types.OCILayer, History: v1.History{
			Created: created, CreatedBy: "watchsan hack/image: passwd, group, CA bundle, /tmp (as distroless static nonroot)"}},
		mutate.Addendum{Layer: app, MediaType: types.OCILayer, History: v1.History{
			Created: created, CreatedBy: "watchsan hack/image: COPY " + path.Base(b.Path) + " " + entry}},
	)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Created = created
	cf.OS, cf.Architecture, cf.Variant = b.Platform.OS, b.Platform.Architecture, b.Platform.Variant
	cf.Config = v1.Config{
		Entrypoint: []string{entry},
		User:       User,
		WorkingDir: WorkingDir,
		Env: []string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"SSL_CERT_FILE=" + CACertsPath,
		},
		Labels: labels(o),
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, err
	}
	return mutate.Annotations(img, labels(o)).(v1.Image), nil
}

func labels(o Options) map[string]string {
	src := o.Source
	if src == "" {
		src = DefaultSource
	}
	title := o.Title
	if title == "" {
		title = "watchsan"
	}
	l := map[string]string{
		"org.opencontainers.image.title":    title,
		"org.opencontainers.image.source":   src,
		"org.opencontainers.image.version":  o.Version,
		"org.opencontainers.image.licenses": License,
		"org.opencontainers.image.created":  o.Created.Format(time.RFC3339),
	}
	if o.Revision != "" {
		l["org.opencontainers.image.revision"] = o.Revision
	}
	return l
}

// modeDir marks a directory entry in file.mode.
const modeDir = 1 << 31

type file struct {
	name     string // relative, "dir/" for a directory
	mode     int64
	uid, gid int
	data     []byte
}

// layer writes files (sorted, so the digest depends only on their content) as one gzipped OCI
// layer, every entry stamped with mtime.
func layer(files []file, mtime time.Time) (v1.Layer, error) {
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{
			Name:    f.name,
			Mode:    f.mode &^ modeDir,
			Uid:     f.uid,
			Gid:     f.gid,
			ModTime: mtime,
			Format:  tar.FormatPAX,
		}
		if f.mode&modeDir != 0 {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if path.Clean(strings.TrimSuffix(f.name, "/")) != strings.TrimSuffix(f.name, "/") {
			return nil, fmt.Errorf("bad path %q", f.name)
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
}

// checkStatic refuses a binary that would not run on an empty base: one linked dynamically
// (a cgo build: it needs a loader and libc the image does not have) or built for another
// architecture than its platform says.
func checkStatic(bin []byte, arch string) error {
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return fmt.Errorf("not a Linux (ELF) binary: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("dynamically linked (has an ELF interpreter): build with CGO_ENABLED=0")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		return fmt.Errorf("dynamically linked against %v: build with CGO_ENABLED=0", libs)
	}
	want := map[string]elf.Machine{
		"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "arm": elf.EM_ARM,
		"ppc64le": elf.EM_PPC64, "s390x": elf.EM_S390, "riscv64": elf.EM_RISCV, "386": elf.EM_386,
	}[arch]
	if want == elf.EM_NONE {
		return fmt.Errorf("unsupported architecture %q", arch)
	}
	if f.Machine != want {
		return fmt.Errorf("built for %s, but the platform says %s", f.Machine, arch)
	}
	return nil
}

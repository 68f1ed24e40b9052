package cli

import (
	"fmt"
	"runtime/debug"
)

// Version and Revision are set at build time by `make build`, `make image` and the Dockerfile
// (-ldflags "-X github.com/watchsan/watchsan/internal/cli.Version=... -X ...cli.Revision=...").
// Empty: what the Go toolchain recorded in the binary's build info is used instead.
var (
	Version  = ""
	Revision = ""
)

// build is which build is running, for `watchsan version` and watchsan_build_info.
type build struct {
	// Version is the -ldflags version, else the main module's version as the toolchain stamped
	// it (a tag, or a pseudo-version from the commit); "(devel)" when there is neither.
	Version string
	// Revision is the -ldflags revision, else vcs.revision; "" when the build recorded none.
	Revision string
	// Modified is vcs.modified: the work tree had uncommitted changes. False with an -ldflags
	// revision (`git describe --dirty` says so in Version).
	Modified bool
}

// currentBuild reads the -ldflags values and the binary's build info. A `go install
// ./cmd/watchsan` from a clone stamps the module's pseudo-version and vcs.revision; one from a
// linked git worktree, or with -buildvcs=false, records neither (golang/go#58218), and
// String says so rather than print a bare "(devel)".
func currentBuild() build {
	b := build{Version: Version, Revision: Revision}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		if b.Version == "" {
			b.Version = "(devel)"
		}
		return b
	}
	if b.Version == "" {
		b.Version = bi.Main.Version
	}
	if b.Version == "" {
		b.Version = "(devel)"
	}
	if b.Revision == "" {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Revision = s.Value
			case "vcs.modified":
				b.Modified = s.Value == "true"
			}
		}
	}
	return b
}

// String is the version line: "v0.0.0-20261207043000-c8607fb31f7a (revision c8607fb31f7a)".
func (b build) String() string {
	switch {
	case b.Revision == "" && b.Version == "(devel)":
		return b.Version + " (no VCS revision recorded: built with -buildvcs=false, see `go env GOFLAGS`, or in a linked git worktree; `make build` stamps it)"
	case b.Revision == "":
		return b.Version // stamped by -ldflags without a revision: the image's release version
	}
	rev := b.Revision
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if b.Modified {
		rev += ", modified"
	}
	return fmt.Sprintf("%s (revision %s)", b.Version, rev)
}

func version() string { return currentBuild().String() }

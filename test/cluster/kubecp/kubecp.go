// Package kubecp is the tar that kubectl cp runs in a container, for the test harness's
// containers: the stand-in kubelet's (test/cluster/kubelet), whose containers share a
// directory, and the real node's toolbox image (test/cluster/node/toolbox).
package kubecp

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// ExitError is a failed tar: the exit code and the message a real tar prints on stderr.
type ExitError struct {
	Code int
	Msg  string
}

func (e *ExitError) Error() string { return e.Msg }

func exit(code int, format string, args ...any) error {
	return &ExitError{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// Tar runs what kubectl cp runs: "tar cf - PATH..." (members named PATH without the leading
// slash, as GNU tar names them) and "tar [--no-same-*] -xmf - [-C DIR]", with args as given
// after "tar". Container paths are under root ("/" in a real container). A failure is an
// *ExitError.
func Tar(root string, args []string, in io.Reader, out io.Writer) error {
	var create, extract bool
	dir := "/"
	var paths []string
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "cf" || a == "-cf":
			create = true
		case a == "-xmf" || a == "xmf" || a == "-xf" || a == "xf":
			extract = true
		case a == "-":
		case a == "-C" && i+1 < len(args):
			dir = args[i+1]
			i++
		case strings.HasPrefix(a, "--no-same-"):
		case strings.HasPrefix(a, "-"):
			return exit(2, "tar: unsupported option %s", a)
		default:
			paths = append(paths, a)
		}
	}
	switch {
	case create && len(paths) > 0:
		tw := tar.NewWriter(out)
		for _, p := range paths {
			if err := create1(tw, root, p); err != nil {
				return exit(2, "tar: %s: %v", p, err)
			}
		}
		if err := tw.Close(); err != nil {
			return exit(2, "tar: %v", err)
		}
		return nil
	case extract:
		if fi, err := os.Stat(under(root, dir)); err != nil || !fi.IsDir() {
			return exit(2, "tar: %s: Cannot open: No such file or directory", dir)
		}
		if err := extractAll(in, root, dir); err != nil {
			return exit(2, "tar: %v", err)
		}
		return nil
	}
	return exit(2, "tar: only cf - PATH and -xmf - [-C DIR]")
}

// under maps container path p to the file system under root.
func under(root, p string) string {
	return filepath.Join(root, filepath.FromSlash(path.Clean("/"+p)))
}

func create1(tw *tar.Writer, root, p string) error {
	base := under(root, p)
	name := strings.TrimPrefix(path.Clean("/"+p), "/")
	return filepath.WalkDir(base, func(file string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(base, file)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() && !fi.IsDir() {
			return nil
		}
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		hdr.Name = path.Join(name, filepath.ToSlash(rel))
		if fi.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.IsDir() {
			return nil
		}
		r, err := os.Open(file)
		if err != nil {
			return err
		}
		defer r.Close()
		_, err = io.Copy(tw, r)
		return err
	})
}

func extractAll(in io.Reader, root, dir string) error {
	tr := tar.NewReader(in)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if !filepath.IsLocal(filepath.FromSlash(hdr.Name)) {
			return fmt.Errorf("%s: member outside the directory", hdr.Name)
		}
		dst := under(root, path.Join(dir, hdr.Name))
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			w, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
			if err != nil {
				return err
			}
			_, err = io.Copy(w, tr)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
	}
}

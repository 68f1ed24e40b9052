package kubelet

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	utilexec "k8s.io/utils/exec"
)

type bufCloser struct{ bytes.Buffer }

func (*bufCloser) Close() error { return nil }

func runFake(t *testing.T, rt fakeRuntime, stdin io.Reader, cmd ...string) (string, string, error) {
	t.Helper()
	var out, errOut bufCloser
	err := rt.ExecInContainer(context.Background(), "pod", "", Container, cmd, stdin, &out, &errOut, false, nil, 0)
	return out.String(), errOut.String(), err
}

// TestFakeRuntimeCommands: the stand-in kubelet's containers do what kubectl cp and the e2e
// tests rely on, without an apiserver: tar out and back in under Root, exit codes as
// CodeExitError, and no tar member escaping the extraction directory.
func TestFakeRuntimeCommands(t *testing.T) {
	k := &Kubelet{Root: t.TempDir(), closed: make(chan struct{})}
	rt := fakeRuntime{k: k}
	if err := os.MkdirAll(filepath.Join(k.Root, "src", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(k.Root, "src", "sub", "f.txt"), []byte("payload"), 0o644); err != nil {
		t.Fatal(err)
	}

	archive, stderr, err := runFake(t, rt, nil, "tar", "cf", "-", "/src")
	if err != nil {
		t.Fatalf("tar cf: %v %s", err, stderr)
	}
	var names []string
	tr := tar.NewReader(strings.NewReader(archive))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	if strings.Join(names, ",") != "src/,src/sub/,src/sub/f.txt" {
		t.Fatalf("tar cf - /src members %q, want GNU tar's names without the leading slash", names)
	}

	if err := os.MkdirAll(filepath.Join(k.Root, "dst"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := runFake(t, rt, strings.NewReader(archive), "tar", "--no-same-permissions", "--no-same-owner", "-xmf", "-", "-C", "/dst"); err != nil {
		t.Fatalf("tar -xmf: %v %s", err, stderr)
	}
	if b, err := os.ReadFile(filepath.Join(k.Root, "dst", "src", "sub", "f.txt")); err != nil || string(b) != "payload" {
		t.Fatalf("extracted file: %q %v", b, err)
	}
	if _, _, err := runFake(t, rt, strings.NewReader(archive), "tar", "-xmf", "-", "-C", "/missing"); !exitCode(err, 2) {
		t.Fatalf("tar -C into a missing directory: %v, want exit 2", err)
	}

	var evil bytes.Buffer
	tw := tar.NewWriter(&evil)
	_ = tw.WriteHeader(&tar.Header{Name: "../escaped.txt", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
	_, _ = tw.Write([]byte("x"))
	_ = tw.Close()
	if _, _, err := runFake(t, rt, &evil, "tar", "-xmf", "-", "-C", "/dst"); !exitCode(err, 2) {
		t.Fatalf("a member outside the directory: %v, want exit 2", err)
	}
	if _, err := os.Stat(filepath.Join(k.Root, "escaped.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("../escaped.txt was written: %v", err)
	}

	if out, _, err := runFake(t, rt, strings.NewReader("in"), "cat"); err != nil || out != "in" {
		t.Fatalf("cat: %q %v", out, err)
	}
	if _, _, err := runFake(t, rt, nil, "test", "-d", "/dst/src"); err != nil {
		t.Fatalf("test -d on a directory: %v", err)
	}
	if _, _, err := runFake(t, rt, nil, "test", "-d", "/dst/src/sub/f.txt"); !exitCode(err, 1) {
		t.Fatalf("test -d on a file: %v, want exit 1", err)
	}
	if _, _, err := runFake(t, rt, nil, "exit", "7"); !exitCode(err, 7) {
		t.Fatalf("exit 7: %v", err)
	}
	if _, stderr, err := runFake(t, rt, nil, "bash"); !exitCode(err, 127) || !strings.Contains(stderr, "not found") {
		t.Fatalf("unknown command: %v %q, want exit 127", err, stderr)
	}
}

func exitCode(err error, code int) bool {
	var ee utilexec.CodeExitError
	return errors.As(err, &ee) && ee.Code == code
}

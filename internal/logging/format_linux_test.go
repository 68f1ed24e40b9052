package logging

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal pair: the terminal side is what a person's shell gives
// watchsan as stderr.
func openPTY(t *testing.T) (ptmx, tty *os.File) {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { _ = ptmx.Close() })
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlockpt: %v", err)
	}
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("ptsname: %v", err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open the terminal side: %v", err)
	}
	t.Cleanup(func() { _ = tty.Close() })
	return ptmx, tty
}

// --log-format's default is console on a terminal and json on anything else; a format given
// is kept either way.
func TestResolveFormat(t *testing.T) {
	_, tty := openPTY(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	for _, c := range []struct {
		name, format string
		out          *os.File
		want         string
	}{
		{"terminal, default", "", tty, "console"},
		{"pipe, default", "", w, "json"},
		{"terminal, json asked", "json", tty, "json"},
		{"pipe, console asked", "console", w, "console"},
	} {
		if got := ResolveFormat(c.format, c.out); got != c.want {
			t.Errorf("%s: ResolveFormat(%q) = %q, want %q", c.name, c.format, got, c.want)
		}
	}
}

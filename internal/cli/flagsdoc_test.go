package cli

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// docs/flags.md is what the code registers; a flag added, removed or changed
// without `make docs` fails here.
func TestFlagsReferenceUpToDate(t *testing.T) {
	var b bytes.Buffer
	WriteFlagsReference(&b)
	have, err := os.ReadFile("../../docs/flags.md")
	if err != nil {
		t.Fatalf("%v: run `make docs` to write it", err)
	}
	if bytes.Equal(have, b.Bytes()) {
		return
	}
	want, got := strings.Split(b.String(), "\n"), strings.Split(string(have), "\n")
	for i := range max(len(want), len(got)) {
		var w, g string
		if i < len(want) {
			w = want[i]
		}
		if i < len(got) {
			g = got[i]
		}
		if w != g {
			t.Fatalf("docs/flags.md is out of date with the flags; run `make docs`. First difference, line %d:\n file: %s\n code: %s", i+1, g, w)
		}
	}
}

// The reference has every flag of the proxy.
func TestFlagsReferenceHasEveryFlag(t *testing.T) {
	var b bytes.Buffer
	WriteFlagsReference(&b)
	code := exitOK
	NewCommand(nil, nil, &code).Flags().VisitAll(func(f *pflag.Flag) {
		if !strings.Contains(b.String(), "`--"+f.Name) {
			t.Errorf("--%s missing", f.Name)
		}
	})
}

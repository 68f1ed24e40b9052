package cli

import (
	"io"

	"github.com/watchsan/watchsan/internal/check"
)

// runCheck runs `watchsan check [flags]` (package check has its own flag set, so this is all
// the wiring there is).
func runCheck(args []string, stdout, stderr io.Writer) int {
	return check.Main(args, stdout, stderr)
}

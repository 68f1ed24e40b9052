// Command flagsdoc writes the flags reference, docs/flags.md, from the code (`make docs`).
package main

import (
	"bytes"
	"fmt"
	"os"

	"github.com/watchsan/watchsan/internal/cli"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: flagsdoc FILE")
		os.Exit(2)
	}
	var b bytes.Buffer
	cli.WriteFlagsReference(&b)
	if err := os.WriteFile(os.Args[1], b.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "flagsdoc:", err)
		os.Exit(1)
	}
}

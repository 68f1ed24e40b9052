// Command watchsan-bench measures watchsan against a direct connection and the usual ways of
// proxying a watch (make bench); see docs/bench/README.md.
package main

import (
	"os"

	"github.com/watchsan/watchsan/internal/bench"
)

func main() { os.Exit(bench.Main(os.Args[1:], os.Stdout, os.Stderr)) }

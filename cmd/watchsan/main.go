// Command watchsan is a Kubernetes apiserver proxy that makes watches trustworthy.
package main

import (
	"os"

	"github.com/watchsan/watchsan/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }

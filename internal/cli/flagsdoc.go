package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/watchsan/watchsan/internal/config"
)

//go:generate go run ../../hack/flagsdoc ../../docs/flags.md

// WriteFlagsReference writes docs/flags.md: every command's flags, in their help groups, as
// the code registers them (TestFlagsReferenceUpToDate fails when the file drifts; `make docs`
// writes it again).
func WriteFlagsReference(w io.Writer) {
	code := exitOK
	root := NewCommand(io.Discard, io.Discard, &code)
	fmt.Fprint(w, "# watchsan flags\n\n"+
		"<!-- Generated from the code by `make docs` (hack/flagsdoc); do not edit. -->\n\n"+
		"Every flag of `watchsan` can also be set in the `--config` YAML file, under the flag's name\n"+
		"(`upstream` and the other repeatable flags take lists); flags win over the file. Bad flags\n"+
		"or configuration: every problem is listed at once, and watchsan exits with code 2.\n"+
		"`-v N` follows klog's convention: 0 is `--log-level=info`, 1 or more `--log-level=debug`.\n")
	writeCommandFlags(w, root)
	for _, c := range root.Commands() {
		if c.IsAvailableCommand() && c.HasAvailableLocalFlags() {
			writeCommandFlags(w, c)
		}
	}
}

func writeCommandFlags(w io.Writer, c *cobra.Command) {
	fmt.Fprintf(w, "\n## %s\n", c.CommandPath())
	if c.Short != "" && c.HasParent() {
		fmt.Fprintf(w, "\n%s.\n", c.Short)
	}
	for _, g := range config.Groups(c.LocalFlags()) {
		fmt.Fprintf(w, "\n### %s\n\n| flag | default | meaning |\n|---|---|---|\n", g.Title)
		for _, f := range g.Flags {
			typ, usage := pflag.UnquoteUsage(f)
			name := "`--" + f.Name
			if typ != "" {
				name += " " + typ
			}
			name += "`"
			if f.Shorthand != "" {
				name = "`-" + f.Shorthand + "`, " + name
			}
			def := ""
			if f.DefValue != "" && f.DefValue != "[]" && !(typ == "" && f.DefValue == "false") {
				def = "`" + strings.ReplaceAll(f.DefValue, "|", `\|`) + "`"
			}
			fmt.Fprintf(w, "| %s | %s | %s |\n", name, def, strings.ReplaceAll(usage, "|", `\|`))
		}
	}
}

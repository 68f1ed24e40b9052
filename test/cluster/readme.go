package cluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// CodeBlock is a fenced code block of a Markdown file.
type CodeBlock struct {
	// Lang is the fence's info string ("sh", "yaml", "").
	Lang string
	// Text is the block's content, every line ending in a newline.
	Text string
	// Line is the line number of the opening fence.
	Line int
}

// MarkdownBlocks returns the fenced code blocks (```) of the Markdown file path that are under
// the first heading whose text is heading (e.g. "### Run it"), up to the next heading of the
// same or a higher level; heading "" means the whole file. Tests use it to run what a README
// tells its reader to run, exactly as written.
func MarkdownBlocks(path, heading string) ([]CodeBlock, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(b), "\n")
	level := 0 // of the heading, once found
	in := heading == ""
	var out []CodeBlock
	var cur *CodeBlock // the block being read, nil outside one
	fence := false
	for i, l := range lines {
		if fence {
			if strings.HasPrefix(l, "```") {
				fence = false
				if cur != nil {
					out = append(out, *cur)
					cur = nil
				}
			} else if cur != nil {
				cur.Text += l + "\n"
			}
			continue
		}
		if lang, ok := strings.CutPrefix(l, "```"); ok {
			fence = true
			if in {
				cur = &CodeBlock{Lang: strings.TrimSpace(lang), Line: i + 1}
			}
			continue
		}
		if !strings.HasPrefix(l, "#") || heading == "" {
			continue
		}
		n := len(l) - len(strings.TrimLeft(l, "#"))
		switch {
		case !in && strings.TrimSpace(l) == heading:
			in, level = true, n
		case in && n <= level:
			return out, nil
		}
	}
	if fence {
		return nil, fmt.Errorf("%s: a code block is not closed", path)
	}
	if !in {
		return nil, fmt.Errorf("%s: no heading %q", path, heading)
	}
	return out, nil
}

// Shell runs script with bash (-e -u -o pipefail) in dir, as a reader of a README would in a
// shell: the real kubectl of this cluster first on PATH, KUBECONFIG=kubeconfig, HOME in Dir,
// and env added. It returns stdout and stderr; a non-zero exit is an error that includes
// stderr.
func (c *Cluster) Shell(ctx context.Context, dir, kubeconfig, script string, env ...string) ([]byte, []byte, error) {
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	path := filepath.Dir(c.KubectlPath) + ":" + os.Getenv("PATH")
	base := []string{"PATH=" + path, "KUBECONFIG=" + kubeconfig, "HOME=" + filepath.Join(c.Dir, "home")}
	for _, kv := range processEnv() {
		if !strings.HasPrefix(kv, "PATH=") && !strings.HasPrefix(kv, "HOME=") {
			base = append(base, kv)
		}
	}
	cmd.Env = append(base, env...)
	cmd.SysProcAttr = sysProcAttr()
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), stderr.Bytes(), fmt.Errorf("shell in %s: %w: %s\nscript:\n%s", dir, err, bytes.TrimSpace(stderr.Bytes()), script)
	}
	return stdout.Bytes(), stderr.Bytes(), nil
}

package cluster

import (
	"os"
	"path/filepath"
	"testing"
)

// TestMarkdownBlocks: the blocks under a heading, up to the next heading of its level or
// higher, with a "# comment" inside a block not taken for a heading.
func TestMarkdownBlocks(t *testing.T) {
	md := "# Top\n```sh\nbefore\n```\n## A\ntext\n```sh\none\n# not a heading\ntwo\n```\n### A.1\n```yaml\nk: v\n```\n## B\n```sh\nthree\n```\n"
	path := filepath.Join(t.TempDir(), "README.md")
	if err := os.WriteFile(path, []byte(md), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := MarkdownBlocks(path, "## A")
	if err != nil {
		t.Fatal(err)
	}
	want := []CodeBlock{{Lang: "sh", Text: "one\n# not a heading\ntwo\n", Line: 7}, {Lang: "yaml", Text: "k: v\n", Line: 13}}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("block %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	all, err := MarkdownBlocks(path, "")
	if err != nil || len(all) != 4 {
		t.Errorf("whole file: %d blocks (%v), want 4", len(all), err)
	}
	if _, err := MarkdownBlocks(path, "## C"); err == nil {
		t.Error("no error for a heading that is not there")
	}
	if err := os.WriteFile(path, []byte("## A\n```sh\nopen\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := MarkdownBlocks(path, "## A"); err == nil {
		t.Error("no error for a block left open")
	}
}

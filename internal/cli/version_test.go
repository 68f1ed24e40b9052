package cli

import (
	"strings"
	"testing"
)

// The version line names the revision `make build` stamps (-ldflags), and says why there is
// none rather than print a bare "(devel)".
func TestVersionLine(t *testing.T) {
	defer func(v, r string) { Version, Revision = v, r }(Version, Revision)

	Version, Revision = "v1.2.3-4-gabc", "0123456789abcdef0123"
	b := currentBuild()
	if b.Version != "v1.2.3-4-gabc" || b.Revision != "0123456789abcdef0123" {
		t.Fatalf("currentBuild with -ldflags values = %+v", b)
	}
	if got, want := b.String(), "v1.2.3-4-gabc (revision 0123456789ab)"; got != want {
		t.Errorf("version line %q, want %q", got, want)
	}
	code, out, _ := run("version")
	if code != exitOK || out != "watchsan v1.2.3-4-gabc (revision 0123456789ab)\n" {
		t.Errorf("watchsan version: %d %q", code, out)
	}

	if got := (build{Version: "(devel)"}).String(); !strings.Contains(got, "no VCS revision recorded") {
		t.Errorf("without a revision: %q", got)
	}
	// The image stamps its release version alone (the Dockerfile's -ldflags): printed as it is.
	if got := (build{Version: "v9.8.7"}).String(); got != "v9.8.7" {
		t.Errorf("a stamped version without a revision: %q", got)
	}
	if got := (build{Version: "v0.0.0-20261207043000-c8607fb31f7a", Revision: "c8607fb31f7a0ea5f307bb6e769357ac26f238d2", Modified: true}).String(); got != "v0.0.0-20261207043000-c8607fb31f7a (revision c8607fb31f7a, modified)" {
		t.Errorf("from build info: %q", got)
	}
}

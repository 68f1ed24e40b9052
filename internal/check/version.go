package check

import (
	"fmt"
	"strconv"
	"strings"
)

// affectedRange is a range of Kubernetes patch releases, bounds included, whose apiservers
// send DELETED watch events with the object's previous resourceVersion (docs/design.md
// section 1a).
type affectedRange struct {
	minor      int // of major 1
	first      int // first affected patch
	last       int // last affected patch
	fixedIn    string
	rangeLabel string
}

// affectedRanges are 1.7.0-1.7.12, 1.8.0-1.8.7 and 1.9.0-1.9.2: PR #46223 shipped in 1.7.0 and
// its fix, PR #58547, in 1.7.13, 1.8.8, 1.9.3 and 1.10.0.
var affectedRanges = []affectedRange{
	{7, 0, 12, "1.7.13", "1.7.0-1.7.12"},
	{8, 0, 7, "1.8.8", "1.8.0-1.8.7"},
	{9, 0, 2, "1.9.3", "1.9.0-1.9.2"},
}

// AffectedRangesText lists the affected releases, for reports.
const AffectedRangesText = "1.7.0-1.7.12, 1.8.0-1.8.7, 1.9.0-1.9.2"

// parseVersion reads major, minor and patch from a gitVersion as an apiserver reports it:
// "v1.9.2", "1.9.2", "v1.9.2-gke.1", "v1.8.3+k3s1", "v1.10.0-alpha.1". What follows the patch
// number (a pre-release or a vendor's suffix) is ignored: vendors append their own builds to
// the upstream release they are based on.
func parseVersion(s string) (major, minor, patch int, ok bool) {
	s = strings.TrimPrefix(strings.TrimSpace(s), "v")
	if i := strings.IndexAny(s, "-+"); i >= 0 {
		s = s[:i]
	}
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return 0, 0, 0, false
	}
	var n [3]int
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 || p == "" || p[0] == '+' {
			return 0, 0, 0, false
		}
		n[i] = v
	}
	return n[0], n[1], n[2], true
}

// VersionAffected says whether an apiserver reporting gitVersion has the 1.7-1.9 DELETED
// event bug: affected is true inside the ranges; known is false when gitVersion does not read
// as MAJOR.MINOR.PATCH (then affected is false and nothing can be said from the version).
// detail says which range and the release that fixed it, or why it is not affected.
func VersionAffected(gitVersion string) (affected, known bool, detail string) {
	major, minor, patch, ok := parseVersion(gitVersion)
	if !ok {
		return false, false, fmt.Sprintf("version %q does not read as MAJOR.MINOR.PATCH", gitVersion)
	}
	if major == 1 {
		for _, r := range affectedRanges {
			if minor == r.minor && patch >= r.first && patch <= r.last {
				return true, true, fmt.Sprintf("in the affected range %s (kubernetes#58545; fixed in %s)", r.rangeLabel, r.fixedIn)
			}
		}
	}
	return false, true, "outside the affected ranges " + AffectedRangesText
}

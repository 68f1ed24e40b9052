package check

import "testing"

func TestVersionAffected(t *testing.T) {
	for _, tc := range []struct {
		v               string
		affected, known bool
	}{
		{"v1.6.13", false, true},
		{"v1.7.0", true, true},
		{"v1.7.12", true, true},
		{"v1.7.13", false, true},
		{"v1.8.0", true, true},
		{"v1.8.7", true, true},
		{"v1.8.8", false, true},
		{"v1.9.0", true, true},
		{"v1.9.2", true, true},
		{"v1.9.2-gke.1", true, true},
		{"1.9.2", true, true},
		{"v1.8.3+k3s1", true, true},
		{"v1.9.3", false, true},
		{"v1.9.3-gke.0", false, true},
		{"v1.10.0", false, true},
		{"v1.10.0-alpha.1", false, true},
		{"v1.37.2", false, true},
		{"v2.7.0", false, true},
		{"v1.17.0", false, true}, // minor 17 is not minor 7
		{"v1.9", false, false},
		{"", false, false},
		{"v1.9.x", false, false},
		{"v1.9.2.1", false, false},
		{"v1.-9.2", false, false},
	} {
		affected, known, detail := VersionAffected(tc.v)
		if affected != tc.affected || known != tc.known {
			t.Errorf("VersionAffected(%q) = %v, %v (%s); want %v, %v", tc.v, affected, known, detail, tc.affected, tc.known)
		}
	}
}

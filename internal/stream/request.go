package stream

import (
	"net/http"
	"strings"
)

// IsWatchRequest reports whether r asks the apiserver for a watch stream, deciding as the
// apiserver's RequestInfoFactory does: a GET on a collection (/api/v1/pods,
// /api/v1/namespaces/ns/pods, /apis/group/version/...; no object name) whose watch parameter
// is present and not "0" or "false" (any case, so "", "1", "true" and "yes" all watch), or a
// GET on the legacy /api/v1/watch/... and /apis/group/version/watch/... paths. It does not
// modify r.
func IsWatchRequest(r *http.Request) bool {
	if r == nil || r.URL == nil || r.Method != http.MethodGet {
		return false
	}
	path := strings.Trim(r.URL.Path, "/")
	if path == "" {
		return false
	}
	parts := strings.Split(path, "/")
	if len(parts) < 3 {
		return false
	}
	switch parts[0] {
	case "api":
		parts = parts[1:]
	case "apis":
		if len(parts) < 4 {
			return false
		}
		parts = parts[2:]
	default:
		return false
	}
	parts = parts[1:] // the version
	switch parts[0] {
	case "watch":
		return len(parts) >= 2
	case "proxy":
		return false
	case "namespaces":
		// /namespaces/{ns}/{resource}...: the resource follows, unless it is a subresource of
		// the namespace itself.
		if len(parts) > 2 && parts[2] != "status" && parts[2] != "finalize" {
			parts = parts[2:]
		}
	}
	if len(parts) != 1 {
		return false // an object, or a subresource of one
	}
	values, ok := r.URL.Query()["watch"]
	if !ok || len(values) == 0 {
		return false
	}
	v := values[0]
	return v != "0" && !strings.EqualFold(v, "false")
}

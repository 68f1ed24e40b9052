// Package reqinfo derives verb, resource, namespace and name from an apiserver request path, the
// way the apiserver's RequestInfoFactory does, for labels, logs and per-resource settings (never
// for authorization: the apiserver decides that).
package reqinfo

import (
	"net/http"
	"strings"
)

// Info is what watchsan knows of a request from its method and path.
type Info struct {
	Verb      string // get, list, watch, create, update, patch, delete, deletecollection; or the lower-case method for non-resource paths
	Resource  string // "group/resource/subresource" without empty parts; "" for non-resource paths
	Namespace string
	Name      string
}

// namespaceSubresources are subresources of a namespace, not resources inside it.
var namespaceSubresources = map[string]bool{"status": true, "finalize": true}

// Parse reads r's method and path; isWatch says whether r is a watch (stream.IsWatchRequest).
func Parse(r *http.Request, isWatch bool) Info {
	info := Info{Verb: strings.ToLower(r.Method)}
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	var group string
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		group, parts = parts[1], parts[3:]
	default:
		return info
	}
	if parts[0] == "watch" {
		parts = parts[1:]
	}
	if len(parts) >= 2 && parts[0] == "namespaces" {
		info.Namespace = parts[1]
		if len(parts) > 2 && !namespaceSubresources[parts[2]] {
			parts = parts[2:]
		} else {
			info.Namespace = ""
		}
	}
	if len(parts) == 0 || parts[0] == "" {
		return info
	}
	res := parts[0]
	if len(parts) >= 2 {
		info.Name = parts[1]
	}
	if len(parts) >= 3 {
		res += "/" + parts[2]
	}
	if group != "" {
		res = group + "/" + res
	}
	info.Resource = res
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		switch {
		case isWatch:
			info.Verb = "watch"
		case info.Name == "":
			info.Verb = "list"
		default:
			info.Verb = "get"
		}
	case http.MethodPost:
		info.Verb = "create"
	case http.MethodPut:
		info.Verb = "update"
	case http.MethodPatch:
		info.Verb = "patch"
	case http.MethodDelete:
		if info.Name == "" {
			info.Verb = "deletecollection"
		} else {
			info.Verb = "delete"
		}
	}
	return info
}

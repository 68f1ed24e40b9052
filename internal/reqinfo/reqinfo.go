// Package reqinfo classifies an apiserver request once: its verb (watch included), API group and
// version, resource, subresource, namespace and name. Every decision watchsan makes from a
// request's method, path and query is taken from here: the route (watch pipeline or pass-through),
// the access log, the metric labels and per-resource settings. It is never used for
// authorization: the apiserver decides that.
//
// Parse agrees with the apiserver's RequestInfoFactory (k8s.io/apiserver/pkg/endpoints/request,
// APIPrefixes "api" and "apis", GrouplessAPIPrefixes "api"), which the tests use as their
// oracle, with one deliberate difference: a watch is a GET. Where the factory calls a request
// with another method a watch (HEAD /api/v1/pods?watch=1, POST /api/v1/watch/pods), Parse
// reports the lower-case method as the verb instead, so that such a request is passed through to
// the apiserver (which refuses it) rather than served by the watch pipeline.
package reqinfo

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"k8s.io/apimachinery/pkg/api/validate/content"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metainternalversionscheme "k8s.io/apimachinery/pkg/apis/meta/internalversion/scheme"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Info is what watchsan knows of a request from its method, path and query. Every string is
// a constant or a substring of the request's path or query, except a Name taken from a
// fieldSelector.
type Info struct {
	// IsResourceRequest is true for paths under /api/VERSION/... and /apis/GROUP/VERSION/....
	IsResourceRequest bool
	// Verb is get, list, watch, create, update, patch, delete, deletecollection or proxy for a
	// resource request ("" for a method the apiserver has no verb for); the lower-case method
	// otherwise.
	Verb       string
	APIGroup   string // "" for the core group (/api)
	APIVersion string
	Namespace  string
	// Resource is the plural resource name ("pods", "deployments"), without group or
	// subresource.
	Resource    string
	Subresource string
	// Name is the object's name: from the path, or, for a list or watch, from a fieldSelector
	// that requires metadata.name to equal one value.
	Name string
}

// IsWatch reports whether the request asks for a watch stream (and goes to the watch pipeline).
func (i Info) IsWatch() bool { return i.Verb == "watch" }

// GroupResource is "resource" in the core group and "group/resource" elsewhere: the form in
// which the configuration names a resource (--fix-exempt-resource). "" for non-resource
// requests.
func (i Info) GroupResource() string {
	if i.APIGroup == "" || i.Resource == "" {
		return i.Resource
	}
	return i.APIGroup + "/" + i.Resource
}

// FullResource is GroupResource followed by "/subresource" when there is one ("pods/log",
// "apps/deployments/scale"): the resource of the access log and the metric labels.
func (i Info) FullResource() string {
	switch {
	case i.Subresource == "" || i.Resource == "":
		return i.GroupResource()
	case i.APIGroup == "":
		return i.Resource + "/" + i.Subresource
	}
	return i.APIGroup + "/" + i.Resource + "/" + i.Subresource
}

// maxParts bounds the path segments Parse looks at: prefix, group, version, special verb,
// "namespaces", namespace, resource, name, subresource. Later ones never matter.
const maxParts = 10

// Parse classifies r. It never modifies r and, but for a list or watch with a fieldSelector on
// metadata.name, allocates nothing.
func Parse(r *http.Request) Info {
	info := Info{Verb: lowerMethod(r.Method)}
	if r.URL == nil {
		return info
	}
	var buf [maxParts]string
	parts := split(r.URL.Path, &buf)
	if len(parts) < 3 {
		return info
	}
	switch parts[0] {
	case "api":
		parts = parts[1:]
	case "apis":
		if len(parts) < 4 {
			return info
		}
		info.APIGroup = parts[1]
		parts = parts[2:]
	default:
		return info
	}
	info.IsResourceRequest = true
	info.APIVersion = parts[0]
	parts = parts[1:]

	// /watch/... and /proxy/...: the verb comes from the path (deprecated, but still served).
	switch parts[0] {
	case "watch", "proxy":
		if len(parts) < 2 {
			// The factory fails here (the apiserver answers 500); what it knows by then is the
			// group and version, with the lower-case method as the verb.
			return info
		}
		info.Verb = parts[0]
		parts = parts[1:]
	default:
		info.Verb = methodVerb(r.Method)
	}

	// /namespaces/{namespace}/{resource}/...; but /namespaces/{namespace}[/status|/finalize]
	// is the namespace itself.
	if parts[0] == "namespaces" && len(parts) > 1 {
		info.Namespace = parts[1]
		if len(parts) > 2 && parts[2] != "status" && parts[2] != "finalize" {
			parts = parts[2:]
		}
	}

	// resource/name/subresource/anything/else
	if len(parts) >= 3 && info.Verb != "proxy" {
		info.Subresource = parts[2]
	}
	if len(parts) >= 2 {
		info.Name = parts[1]
	}
	info.Resource = parts[0]

	if info.Name == "" && info.Verb == "get" {
		info.Verb, info.Name = listOrWatch(r.URL)
	}
	if info.Name == "" && info.Verb == "delete" {
		info.Verb = "deletecollection"
	}
	if info.Verb == "watch" && r.Method != http.MethodGet {
		info.Verb = lowerMethod(r.Method) // a watch is a GET; see the package comment
	}
	return info
}

// split splits path as the factory does (trim slashes at both ends, split at every slash, keep
// empty segments in between) into buf, keeping at most maxParts segments, without allocating.
func split(path string, buf *[maxParts]string) []string {
	path = strings.Trim(path, "/")
	if path == "" {
		return buf[:0]
	}
	n := 0
	for n < maxParts-1 {
		i := strings.IndexByte(path, '/')
		if i < 0 {
			break
		}
		buf[n], path = path[:i], path[i+1:]
		n++
	}
	buf[n] = path // the last segment, or the unsplit rest (never looked into)
	return buf[:n+1]
}

// listOrWatch decides a GET on a collection as the factory does: a watch when the first watch
// parameter is anything but "0" or "false" (any case; so "", "1", "true" and "yes" watch), a
// list otherwise; and the name of the one object a fieldSelector metadata.name=X asks for, if
// the query as a whole decodes as ListOptions.
func listOrWatch(u *url.URL) (verb, name string) {
	q := scanQuery(u)
	verb = "list"
	if q.hasWatch && q.watch != "0" && !strings.EqualFold(q.watch, "false") {
		verb = "watch"
	}
	if q.hasFieldSelector && strings.Contains(q.fieldSelector, "metadata.name") {
		name = nameFromFieldSelector(u)
	}
	return verb, name
}

// nameFromFieldSelector is the factory's own reading: decode the whole query as ListOptions
// (any error, in any parameter, means no name) and take an exact metadata.name requirement
// that is a valid path segment. It allocates, so Parse calls it only when the fieldSelector
// mentions metadata.name.
func nameFromFieldSelector(u *url.URL) string {
	var opts metainternalversion.ListOptions
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(u.Query(), metav1.SchemeGroupVersion, &opts); err != nil {
		return ""
	}
	if opts.FieldSelector == nil {
		return ""
	}
	name, ok := opts.FieldSelector.RequiresExactMatch("metadata.name")
	if !ok || len(content.IsPathSegmentName(name)) != 0 {
		return ""
	}
	return name
}

// query holds the first value of the parameters Parse reads.
type query struct {
	watch, fieldSelector       string
	hasWatch, hasFieldSelector bool
}

// manyParams is where scanQuery leaves a query to net/url: url.ParseQuery drops every parameter
// of a query with more than 10000 (GODEBUG urlmaxqueryparams), and a query that long is no hot
// path.
const manyParams = 1000

// scanQuery finds the first watch and fieldSelector values of u's query exactly as
// u.Query() would decode them (pairs split at '&', a pair containing ';' or with a bad escape
// dropped, '+' a space), without allocating unless a key or value is escaped.
func scanQuery(u *url.URL) query {
	var q query
	raw := u.RawQuery
	if strings.Count(raw, "&") >= manyParams {
		v := u.Query()
		if w, ok := v["watch"]; ok && len(w) > 0 {
			q.watch, q.hasWatch = w[0], true
		}
		if f, ok := v["fieldSelector"]; ok && len(f) > 0 {
			q.fieldSelector, q.hasFieldSelector = f[0], true
		}
		return q
	}
	for raw != "" && !(q.hasWatch && q.hasFieldSelector) {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		if pair == "" || strings.IndexByte(pair, ';') >= 0 {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		k, ok := unescape(k)
		if !ok {
			continue
		}
		var target *string
		var seen *bool
		switch k {
		case "watch":
			target, seen = &q.watch, &q.hasWatch
		case "fieldSelector":
			target, seen = &q.fieldSelector, &q.hasFieldSelector
		default:
			// Still a parameter url.Query would keep only if its value unescapes; either way
			// it is not one we read.
			continue
		}
		if *seen {
			continue
		}
		if v, ok = unescape(v); ok {
			*target, *seen = v, true
		}
	}
	return q
}

// unescape is url.QueryUnescape, without allocating when there is nothing to unescape.
func unescape(s string) (string, bool) {
	if strings.IndexByte(s, '%') < 0 && strings.IndexByte(s, '+') < 0 {
		return s, true
	}
	u, err := url.QueryUnescape(s)
	return u, err == nil
}

// methodVerb is the factory's verb for a resource request before it looks at the name and the
// query.
func methodVerb(method string) string {
	switch method {
	case http.MethodPost:
		return "create"
	case http.MethodGet, http.MethodHead:
		return "get"
	case http.MethodPut:
		return "update"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		return "delete"
	}
	return ""
}

// lowerMethod is strings.ToLower(method), without allocating for the usual methods.
func lowerMethod(method string) string {
	switch method {
	case http.MethodGet:
		return "get"
	case http.MethodHead:
		return "head"
	case http.MethodPost:
		return "post"
	case http.MethodPut:
		return "put"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		return "delete"
	case http.MethodOptions:
		return "options"
	}
	return strings.ToLower(method)
}

// ParseGroupResource reads a resource as an operator names it, the way kubectl does
// ("pods", "Pods", "deployments.apps", "deployments.v1.apps") or in GroupResource's own form
// ("apps/deployments"), and returns it in GroupResource's form, so that it matches requests
// exactly. A version is dropped; names are lowercased. A subresource, a version alone or a
// name that cannot be a resource is an error that says what to write.
func ParseGroupResource(s string) (string, error) {
	in := s
	s = strings.ToLower(strings.TrimSpace(s))
	var group, resource string
	switch strings.Count(s, "/") {
	case 0:
		resource, group, _ = strings.Cut(s, ".")
		if v, rest, _ := strings.Cut(group, "."); isVersion(v) {
			group = rest // deployments.v1.apps; pods.v1
		}
	case 1:
		group, resource, _ = strings.Cut(s, "/")
		if isVersion(group) {
			group = "" // v1/pods
		}
	default:
		return "", fmt.Errorf("%q: want a resource, not a subresource or a version path: e.g. pods, deployments.apps or apps/deployments", in)
	}
	if errs := validation.IsDNS1123Label(resource); resource == "" || len(errs) > 0 || isVersion(resource) {
		return "", fmt.Errorf("%q: %q is not a resource name: want e.g. pods, deployments.apps or apps/deployments", in, resource)
	}
	if group == "" {
		return resource, nil
	}
	if errs := validation.IsDNS1123Subdomain(group); len(errs) > 0 {
		return "", fmt.Errorf("%q: %q is not an API group: want e.g. pods, deployments.apps or apps/deployments", in, group)
	}
	return group + "/" + resource, nil
}

// BuiltinGroupWithoutDot reports whether group is one of the API groups Kubernetes serves that
// have no dot in their name (any other group, a CRD's included, has one).
func BuiltinGroupWithoutDot(group string) bool {
	switch group {
	case "", "apps", "batch", "autoscaling", "policy", "extensions":
		return true
	}
	return false
}

func isVersion(s string) bool {
	rest, ok := strings.CutPrefix(s, "v")
	if !ok || rest == "" || rest[0] < '1' || rest[0] > '9' {
		return false
	}
	i := 0
	for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
		i++
	}
	rest = rest[i:]
	for _, q := range []string{"alpha", "beta"} {
		if n, ok := strings.CutPrefix(rest, q); ok {
			return n != "" && strings.Trim(n, "0123456789") == ""
		}
	}
	return rest == ""
}

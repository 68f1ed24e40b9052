package reqinfo

import (
	"fmt"
	"slices"
	"strings"
)

// builtinResources are the resources Kubernetes serves in the groups no CustomResourceDefinition
// can add to (a CRD's group has a dot): the core group and the dotless groups, as the
// apiserver's discovery (`kubectl api-resources`) lists them in 1.37, subresources left out.
// extensions is served no more (its last resource, ingresses, went in 1.22) and is not checked.
var builtinResources = map[string][]string{
	"": {"bindings", "componentstatuses", "configmaps", "endpoints", "events", "limitranges",
		"namespaces", "nodes", "persistentvolumeclaims", "persistentvolumes", "pods", "podtemplates",
		"replicationcontrollers", "resourcequotas", "secrets", "serviceaccounts", "services"},
	"apps":        {"controllerrevisions", "daemonsets", "deployments", "replicasets", "statefulsets"},
	"batch":       {"cronjobs", "jobs"},
	"autoscaling": {"horizontalpodautoscalers"},
	"policy":      {"poddisruptionbudgets"},
}

// CheckBuiltin says whether gr (ParseGroupResource's form: "pods", "apps/deployments") can be
// a resource: in the core group or a dotless group it must be one Kubernetes serves, since no
// CRD or aggregated API adds to those; a resource of any other group may be a CRD's and is
// not checked here. The error names the closest known resource when one is near.
func CheckBuiltin(gr string) error {
	group, resource, ok := strings.Cut(gr, "/")
	if !ok {
		group, resource = "", gr
	}
	known, checked := builtinResources[group]
	if !checked || slices.Contains(known, resource) {
		return nil
	}
	where := "the core API group"
	if group != "" {
		where = "the API group " + group
	}
	msg := fmt.Sprintf("%q is not a resource of %s", resource, where)
	best, bestDist := "", 3
	for _, k := range known {
		if d := EditDistance(resource, k); d < bestDist {
			best, bestDist = k, d
		}
	}
	if best != "" {
		if group != "" {
			best += "." + group
		}
		msg += fmt.Sprintf("; did you mean %s?", best)
	} else {
		msg += " (a custom resource needs its group: e.g. widgets.example.com)"
	}
	return fmt.Errorf("%s", msg)
}

// EditDistance is the Levenshtein distance between a and b (insertions, deletions,
// substitutions): what "did you mean" suggestions rank by, here and for flags (config).
func EditDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

package check

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// UnknownResources returns those of grs (in reqinfo.ParseGroupResource's form: "pods",
// "apps/deployments", "example.com/widgets") that the cluster's discovery does not serve:
// watchsan would match no watch with them. It reads /api/v1 and, per group asked about,
// /apis/GROUP and each of its versions, raw (client-go's discovery client would link its
// whole scheme). A group the cluster does not serve at all makes each of its resources unknown.
func UnknownResources(ctx context.Context, client rest.Interface, grs []string) ([]string, error) {
	served := map[string][]string{} // group -> resources, for the groups asked about
	for _, gr := range grs {
		group, _, ok := strings.Cut(gr, "/")
		if !ok {
			group = ""
		}
		if _, done := served[group]; done {
			continue
		}
		names, err := groupResources(ctx, client, group)
		if err != nil {
			return nil, err
		}
		served[group] = names
	}
	var unknown []string
	for _, gr := range grs {
		group, resource, ok := strings.Cut(gr, "/")
		if !ok {
			group, resource = "", gr
		}
		if !slices.Contains(served[group], resource) {
			unknown = append(unknown, gr)
		}
	}
	return unknown, nil
}

// groupResources lists the resources (no subresources) group serves in any of its versions;
// none when the cluster does not serve the group.
func groupResources(ctx context.Context, client rest.Interface, group string) ([]string, error) {
	paths := []string{"/api/v1"}
	if group != "" {
		body, err := client.Get().AbsPath("/apis", group).Do(ctx).Raw()
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("GET /apis/%s: %w", group, err)
		}
		var g metav1.APIGroup
		if err := json.Unmarshal(body, &g); err != nil {
			return nil, fmt.Errorf("GET /apis/%s: %w", group, err)
		}
		paths = paths[:0]
		for _, v := range g.Versions {
			paths = append(paths, "/apis/"+v.GroupVersion)
		}
	}
	var names []string
	for _, p := range paths {
		body, err := client.Get().AbsPath(p).Do(ctx).Raw()
		if err != nil {
			return nil, fmt.Errorf("GET %s: %w", p, err)
		}
		var l metav1.APIResourceList
		if err := json.Unmarshal(body, &l); err != nil {
			return nil, fmt.Errorf("GET %s: %w", p, err)
		}
		for _, r := range l.APIResources {
			if !strings.Contains(r.Name, "/") && !slices.Contains(names, r.Name) {
				names = append(names, r.Name)
			}
		}
	}
	return names, nil
}

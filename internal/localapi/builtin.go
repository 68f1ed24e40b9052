package localapi

// builtin are the API group-versions Kubernetes itself defines, by group: k8s.io/api v0.37.2's
// packages (each GroupName and version directory), the module watchsan builds with. The
// kube-apiserver serves those it enables itself; none of them is an aggregated server's unless
// the cluster admin replaced its local APIService. Kept as data rather than read from
// client-go's scheme, which would link every API group into the binary (docs/design.md,
// "Packages").
var builtin = map[string][]string{
	"":                             {"v1"},
	"admission.k8s.io":             {"v1", "v1beta1"},
	"admissionregistration.k8s.io": {"v1", "v1alpha1", "v1beta1"},
	"apidiscovery.k8s.io":          {"v2", "v2beta1"},
	"apps":                         {"v1", "v1beta1", "v1beta2"},
	"authentication.k8s.io":        {"v1", "v1alpha1", "v1beta1"},
	"authorization.k8s.io":         {"v1", "v1beta1"},
	"autoscaling":                  {"v1", "v2"},
	"batch":                        {"v1", "v1beta1"},
	"certificates.k8s.io":          {"v1", "v1alpha1", "v1beta1"},
	"coordination.k8s.io":          {"v1", "v1alpha2", "v1beta1"},
	"discovery.k8s.io":             {"v1", "v1beta1"},
	"events.k8s.io":                {"v1", "v1beta1"},
	"extensions":                   {"v1beta1"},
	"flowcontrol.apiserver.k8s.io": {"v1", "v1beta1", "v1beta2", "v1beta3"},
	"imagepolicy.k8s.io":           {"v1alpha1"},
	"internal.apiserver.k8s.io":    {"v1alpha1"},
	"lifecycle.k8s.io":             {"v1alpha1"},
	"networking.k8s.io":            {"v1", "v1beta1"},
	"node.k8s.io":                  {"v1", "v1alpha1", "v1beta1"},
	"policy":                       {"v1", "v1beta1"},
	"rbac.authorization.k8s.io":    {"v1", "v1alpha1", "v1beta1"},
	"resource.k8s.io":              {"v1", "v1alpha3", "v1beta1", "v1beta2"},
	"scheduling.k8s.io":            {"v1", "v1alpha3", "v1beta1"},
	"storage.k8s.io":               {"v1", "v1alpha1", "v1beta1"},
	"storagemigration.k8s.io":      {"v1", "v1beta1"},
}

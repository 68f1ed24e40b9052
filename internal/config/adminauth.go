package config

import (
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/spf13/pflag"
)

// The admin listener's authentication (docs/design.md section 13): off loopback, every path but
// the probes' (and /metrics, unless --admin-auth-metrics) answers only a request whose bearer
// token the apiserver authenticates (a TokenReview) and authorizes for the path (a
// SubjectAccessReview of a non-resource URL), as kube-rbac-proxy and controller-runtime's
// secure metrics serving do. /debug/feeds names namespaces, objects watched by name and
// selectors; pprof shows the command line and goroutine stacks.

// The --admin-auth values.
const (
	// AdminAuthDelegated: off loopback, the apiserver authenticates and authorizes every admin
	// request but the probes' (the default).
	AdminAuthDelegated = "delegated"
	// AdminAuthNone: nothing is checked, on any address. Anyone who reaches the port reads
	// /debug/feeds (and pprof with --enable-pprof).
	AdminAuthNone = "none"
)

// AdminAuthConfig is what the operator asked of the admin listener's authentication, as given
// (flags adminAuthFlags registers).
type AdminAuthConfig struct {
	// AdminAuthMode is --admin-auth: AdminAuthDelegated or AdminAuthNone; "" is refused.
	AdminAuthMode string
	// AdminAuthMetrics puts /metrics behind the same check; false (the zero value): /metrics
	// stays open (Prometheus scrapes it without a token).
	AdminAuthMetrics bool
	// AdminAuthPath is the non-resource path every SubjectAccessReview asks about; "": the
	// request's own path, as the apiserver authorizes its own non-resource URLs.
	AdminAuthPath string
	// AdminAuthVerb is the verb every SubjectAccessReview asks about; "" is refused (default get).
	AdminAuthVerb string
	// AdminAuthTokenFile holds the bearer token the reviews are sent with, read at each review
	// (a kubelet-rotated projected token stays current); "": they go as watchsan's own
	// requests do (upstream.Self: the lent identity, when there is one).
	AdminAuthTokenFile string
}

func defaultAdminAuth() AdminAuthConfig {
	return AdminAuthConfig{AdminAuthMode: AdminAuthDelegated, AdminAuthVerb: "get"}
}

func (a *AdminAuthConfig) flags(fs *pflag.FlagSet) {
	fs.StringVar(&a.AdminAuthMode, "admin-auth", a.AdminAuthMode, "delegated: when --admin-listen is not on loopback, every admin path but /healthz, /livez, /readyz (and /metrics, unless --admin-auth-metrics) needs a bearer token the apiserver authenticates (TokenReview) and authorizes for that path (SubjectAccessReview of a non-resource URL: grant get on nonResourceURLs /debug/*); on loopback nothing is checked. none (dangerous): nothing is checked anywhere, and anyone who reaches the port reads /debug/feeds (namespaces, names, selectors) and pprof")
	fs.BoolVar(&a.AdminAuthMetrics, "admin-auth-metrics", a.AdminAuthMetrics, "put /metrics behind the same check as /debug/* (Prometheus then needs a token allowed get on nonResourceURL /metrics)")
	fs.StringVar(&a.AdminAuthPath, "admin-auth-path", a.AdminAuthPath, "the non-resource path each admin SubjectAccessReview asks about, instead of the request's own path (one permission for every admin path, or one distinct from another watchsan's)")
	fs.StringVar(&a.AdminAuthVerb, "admin-auth-verb", a.AdminAuthVerb, "the verb each admin SubjectAccessReview asks about")
	fs.StringVar(&a.AdminAuthTokenFile, "admin-auth-token-file", a.AdminAuthTokenFile, "file with the bearer token watchsan sends its admin TokenReviews and SubjectAccessReviews with (allowed to create both, as system:auth-delegator is; re-read at each review, so a projected service account token can rotate), also used to read the APIServices (which say where clients with tokens of their own share feeds across identities), for nothing else, and never lent; default: the lent identity (the kubeconfig's), needed when watchsan lends none (--no-credentials, --identity-forwarding)")
}

// verbPattern is what a verb looks like: Kubernetes' verbs are lower-case words.
var verbPattern = regexp.MustCompile(`^[a-z][a-z-]*$`)

func (a *AdminAuthConfig) validate(add func(format string, args ...any)) {
	switch a.AdminAuthMode {
	case AdminAuthDelegated, AdminAuthNone:
	default:
		add("--admin-auth %q: want %s or %s", a.AdminAuthMode, AdminAuthDelegated, AdminAuthNone)
	}
	if !verbPattern.MatchString(a.AdminAuthVerb) {
		add("--admin-auth-verb %q: want a lower-case verb such as get", a.AdminAuthVerb)
	}
	if a.AdminAuthPath != "" && (!strings.HasPrefix(a.AdminAuthPath, "/") || strings.ContainsAny(a.AdminAuthPath, "?# ")) {
		add("--admin-auth-path %q: want a path such as /debug/feeds (it starts with /, no query)", a.AdminAuthPath)
	}
	if a.AdminAuthTokenFile != "" {
		if _, err := ReadTokenFile(a.AdminAuthTokenFile); err != nil {
			add("--admin-auth-token-file: %w", err)
		}
	}
}

// ReadTokenFile reads a bearer token from a file (a projected service account token, a Secret's
// key): the whole file, without surrounding white space; an empty one is refused. The error never
// holds the file's content.
func ReadTokenFile(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(string(data))
	if tok == "" {
		return "", fmt.Errorf("%s is empty: it should hold a bearer token", path)
	}
	if strings.ContainsAny(tok, " \t\r\n") {
		return "", fmt.Errorf("%s holds more than one word: it should hold one bearer token", path)
	}
	return tok, nil
}

// AdminAuth is the admin listener's authentication in effect. The zero value checks nothing.
type AdminAuth struct {
	// On: every admin path but the probes' (and /metrics unless Metrics) needs a token the
	// apiserver authenticates and authorizes. False: nothing is checked (loopback, or
	// --admin-auth=none).
	On bool
	// Metrics puts /metrics behind the check too; false: /metrics is open.
	Metrics bool
	// Path is the non-resource path the SubjectAccessReviews ask about; "": the request's own.
	Path string
	// Verb is the verb they ask about; never "" when On.
	Verb string
	// TokenFile holds the token the reviews go with; "": upstream.Self, which is the lent
	// identity (On is refused at start without one or the other).
	TokenFile string
}

// completeAdminAuth resolves the admin listener's authentication, once Lend is known: the one
// place that decides whether it is on and whether watchsan has an identity to ask the apiserver
// with. Its own requests (upstream.Self) carry the lent identity when it lends one, and none
// otherwise: with --no-credentials, with --identity-forwarding (whose kubeconfig identity only
// impersonates), or with a kubeconfig without credentials. An anonymous TokenReview is refused
// by every apiserver that authorizes (system:anonymous may not create tokenreviews), so every
// request would be refused: that is a configuration error, said at start.
func (out *Completed) completeAdminAuth() []error {
	c := out.Config.AdminAuthConfig
	a := AdminAuth{
		On:      c.AdminAuthMode == AdminAuthDelegated && !IsLoopback(out.AdminListen),
		Metrics: c.AdminAuthMetrics, Path: c.AdminAuthPath, Verb: c.AdminAuthVerb, TokenFile: c.AdminAuthTokenFile,
	}
	if !a.On {
		a = AdminAuth{}
	}
	out.AdminAuth = a
	if !a.On || a.TokenFile != "" || out.Lend {
		return nil
	}
	var why string
	switch {
	case out.NoCredentials:
		why = "--no-credentials: it lends no identity"
	case out.IdentityForwarding != "":
		why = "--identity-forwarding: it lends no identity"
	case out.Credentials == nil:
		why = "no kubeconfig was loaded"
	default:
		why = "the kubeconfig's user has no credentials"
	}
	return []error{fmt.Errorf("--admin-listen %s is not a loopback address, so every admin path but /healthz, /livez and /readyz (/debug/feeds names namespaces, objects and selectors; pprof) needs a bearer token the apiserver authenticates and authorizes, and watchsan has no identity to send those TokenReviews and SubjectAccessReviews with (%s). Fix one of: "+
		"--admin-auth-token-file=FILE with a token allowed to create tokenreviews and subjectaccessreviews (a projected service account token; deploy/base/ha does this); "+
		"--admin-listen=127.0.0.1:PORT (on loopback nothing is checked); "+
		"or, dangerous, --admin-auth=none (anyone who reaches the port reads /debug/*)", out.AdminListen, why)}
}

// adminAuthWarnings lists what is allowed but unsafe, or has no effect, about the admin
// listener's authentication.
func (out *Completed) adminAuthWarnings() {
	c := out.Config
	loopback := IsLoopback(c.AdminListen)
	switch {
	case c.AdminAuthMode == AdminAuthNone && !loopback:
		what := "/metrics (upstream addresses, resources, request counts) and /debug/feeds (namespaces, objects watched by name, selectors)"
		if c.EnablePprof {
			what += ", and pprof (the command line, goroutine stacks, CPU-costly profiles)"
		}
		out.Warnings = append(out.Warnings, fmt.Sprintf("--admin-auth=none on --admin-listen %s, which is not a loopback address: anyone who reaches it reads %s", c.AdminListen, what))
	case !loopback && !c.AdminAuthMetrics:
		out.Warnings = append(out.Warnings, fmt.Sprintf("--admin-listen %s is not a loopback address: anyone who reaches it can read /metrics (upstream addresses, resources, request counts); /debug/* needs a token the apiserver authorizes (--admin-auth-metrics puts /metrics behind it too)", c.AdminListen))
	case loopback && (c.AdminAuthMetrics || c.AdminAuthPath != "" || c.AdminAuthTokenFile != ""):
		out.Warnings = append(out.Warnings, fmt.Sprintf("--admin-listen %s is on loopback, where nothing is checked: the --admin-auth-* flags have no effect", c.AdminListen))
	}
}

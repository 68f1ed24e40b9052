package config

import (
	"crypto/tls"
	"fmt"

	"github.com/watchsan/watchsan/internal/upstream"
)

// The --identity-forwarding values (docs/design.md section 8).
const (
	IdentityImpersonate   = "impersonate"
	IdentityRequestHeader = "requestheader"
)

// identityMode parses --identity-forwarding (validated before).
func identityMode(s string) upstream.IdentityMode {
	switch s {
	case IdentityImpersonate:
		return upstream.IdentityImpersonate
	case IdentityRequestHeader:
		return upstream.IdentityRequestHeader
	}
	return upstream.IdentityOff
}

// validateIdentity adds the problems of the client-identity flags, each on its own: a
// combination that would assert nothing, or lend watchsan's identity to clients it did not
// verify, is refused rather than guessed at.
func (c *Config) validateIdentity(add func(format string, a ...any)) {
	if c.ClientCAFile != "" {
		if _, err := loadCA(c.ClientCAFile); err != nil {
			add("--client-ca-file: %w", err)
		}
		if c.TLSCertFile == "" {
			add("--client-ca-file verifies client certificates on the TLS listener: it needs --tls-cert-file and --tls-private-key-file")
		}
	}
	rhFiles := c.RequestHeaderClientCertFile != "" || c.RequestHeaderClientKeyFile != ""
	switch c.IdentityForwarding {
	case "":
		if c.ClientCAFile != "" {
			add("--client-ca-file without --identity-forwarding: a verified certificate would say nothing upstream (the client would be anonymous); set --identity-forwarding=impersonate or =requestheader")
		}
		if rhFiles {
			add("--requestheader-client-cert-file/--requestheader-client-key-file are used only with --identity-forwarding=requestheader")
		}
		return
	case IdentityImpersonate, IdentityRequestHeader:
	default:
		add("--identity-forwarding %q: want impersonate or requestheader (or empty: off)", c.IdentityForwarding)
		return
	}
	if c.TLSCertFile == "" || c.ClientCAFile == "" {
		add("--identity-forwarding=%s forwards the identity of a verified client certificate: it needs --tls-cert-file, --tls-private-key-file and --client-ca-file", c.IdentityForwarding)
	}
	switch c.IdentityForwarding {
	case IdentityImpersonate:
		if c.NoCredentials {
			add("--identity-forwarding=impersonate impersonates with the kubeconfig's identity: it cannot go with --no-credentials")
		}
		if rhFiles {
			add("--requestheader-client-cert-file/--requestheader-client-key-file are used only with --identity-forwarding=requestheader")
		}
	case IdentityRequestHeader:
		if c.RequestHeaderClientCertFile == "" || c.RequestHeaderClientKeyFile == "" {
			add("--identity-forwarding=requestheader needs watchsan's front-proxy client certificate: --requestheader-client-cert-file and --requestheader-client-key-file")
		} else if _, err := tls.LoadX509KeyPair(c.RequestHeaderClientCertFile, c.RequestHeaderClientKeyFile); err != nil {
			add("--requestheader-client-cert-file/--requestheader-client-key-file: %w", err)
		}
	}
}

// completeIdentity resolves the identity settings of out (validated before) and returns the
// problems only the resolved upstreams and kubeconfig show.
func (out *Completed) completeIdentity() []error {
	c := out.Config
	out.Identity = identityMode(c.IdentityForwarding)
	var errs []error
	switch out.Identity {
	case upstream.IdentityImpersonate:
		if out.Credentials == nil || !hasIdentity(out.Credentials) {
			return append(errs, fmt.Errorf("--identity-forwarding=impersonate impersonates with the kubeconfig's identity, and there is none: pass --kubeconfig with a user (token, certificate or exec plugin), or use --identity-forwarding=requestheader"))
		}
		// client-go would set the kubeconfig's own impersonation (as:, as-groups:) over the
		// client's: every client would become that one identity.
		if im := out.Credentials.Impersonate; im.UserName != "" || im.UID != "" || len(im.Groups) > 0 || len(im.Extra) > 0 {
			errs = append(errs, fmt.Errorf("--identity-forwarding=impersonate: the kubeconfig itself impersonates (as: %q), which would replace every client's identity; use a kubeconfig without as/as-groups", im.UserName))
		}
		// The kubeconfig's credentials go upstream (with Impersonate-*), so the same rule as
		// for lending: only to an https upstream the kubeconfig names.
		errs = append(errs, checkLending(out.Upstreams, out.Credentials, c.AllowCredentialsToUpstream)...)
	case upstream.IdentityRequestHeader:
		for _, u := range out.Upstreams {
			if u.Scheme != "https" {
				errs = append(errs, fmt.Errorf("--identity-forwarding=requestheader: upstream %s is not https, where the front-proxy certificate (and with it the X-Remote-* headers) cannot be presented", u))
			}
		}
		cert, err := tls.LoadX509KeyPair(c.RequestHeaderClientCertFile, c.RequestHeaderClientKeyFile)
		if err != nil {
			return append(errs, fmt.Errorf("--requestheader-client-cert-file/--requestheader-client-key-file: %w", err))
		}
		out.FrontProxyCert = &cert
	}
	return errs
}

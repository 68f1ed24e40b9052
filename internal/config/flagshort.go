package config

import (
	"strings"

	"github.com/spf13/pflag"
)

// ShortUsageAnnotation is the pflag annotation that holds a flag's one-line description for
// --help; the flag's Usage, in full, is in docs/flags.md and `watchsan flags`.
const ShortUsageAnnotation = "watchsan.io/short-usage"

// shortUsage is --help's line for each flag whose full description is longer than a line.
// Keep each under about 70 characters: what the flag is, not every rule it follows.
var shortUsage = map[string]string{
	"config-check-interval":             "how often the --config file is checked for changes; 0: only on SIGHUP",
	"admin-auth":                        "delegated (tokens the apiserver authorizes, off loopback) or none",
	"admin-auth-metrics":                "put /metrics behind the same check as /debug/*",
	"admin-auth-path":                   "the path every admin access review asks about (default: the request's)",
	"admin-auth-token-file":             "token for watchsan's own TokenReviews and access reviews",
	"idle-timeout":                      "close a main-listener connection idle this long",
	"max-connections":                   "most connections the main listener serves at once",
	"frontend-replicas":                 "replicas sharing the clients; with the next, shed above the share",
	"frontend-expected-connections":     "client connections all replicas hold together; 0: never shed",
	"connection-shed-rate":              "most connections a second shed while above the share",
	"max-connections-per-source":        "most connections of one client address; 0: auto, -1: none",
	"max-header-connections-per-source": "most connections of one address still sending headers; 0: auto",
	"http2-max-streams-per-connection":  "most concurrent requests on one client HTTP/2 connection",
	"client-http2-write-byte-timeout":   "close a client HTTP/2 connection that takes no byte this long",
	"client-http2-ping-interval":        "ping a client HTTP/2 connection silent this long; 0: never",
	"client-http2-ping-timeout":         "close a client HTTP/2 connection whose ping is not answered",
	"max-request-header-bytes":          "largest header list of one request, bytes",
	"max-header-bytes-per-connection":   "header bytes one connection's requests may hold together; 0: none",
	"max-header-bytes-per-source":       "header bytes one client address's requests may hold; 0: auto",
	"upstream":                          "apiserver URL (repeatable); default: the kubeconfig's server",
	"kubeconfig":                        "kubeconfig: upstream and identity (default $KUBECONFIG, ~/.kube/config)",
	"upstream-discovery":                "endpoints: follow the apiservers' own EndpointSlice; empty: off",
	"allow-non-loopback-credentials":    "allow lending credentials on a listener off loopback (dangerous)",
	"allow-credentials-to-upstream":     "lend the identity to this http:// or other upstream (repeatable)",
	"accept-hosts":                      "regexps: the Host a request that gets the lent identity must name",
	"reject-paths":                      "regexps: paths refused to requests that get the lent identity",
	"reject-methods":                    "regexps: methods refused to requests that get the lent identity",
	"strip-identity-headers":            "headers removed from requests that get a lent or asserted identity",
	"client-ca-file":                    "CA that verifies client certificates (needs --identity-forwarding)",
	"identity-forwarding":               "forward a verified client certificate: impersonate or requestheader",
	"requestheader-client-cert-file":    "front-proxy certificate for --identity-forwarding=requestheader",
	"upstream-http2-stream-window":      "bytes an upstream may send on one HTTP/2 stream ahead of reading",
	"upstream-http2-connection-window":  "bytes an upstream may send on one HTTP/2 connection ahead of reading",
	"http2-ping-timeout":                "close an upstream HTTP/2 connection whose ping goes unanswered",
	"disable-watch-resume":              "end the client's watch when the upstream's breaks; no resume",
	"health-interval":                   "how often each upstream is pinged and its /readyz checked",
	"health-ping-timeout":               "how long an upstream may take to answer a PING before it is down",
	"health-probe-interval":             "least time between /readyz probes of a healthy upstream",
	"health-probe-timeout":              "how long an upstream's /readyz may take before it is degraded",
	"probe-kubeconfig":                  "kubeconfig whose user the /readyz probes go as",
	"fix-mode":                          "repair: sanitize watch streams; observe: only log what repair would do",
	"fix-exempt-resource":               "resource whose watches pass unsanitized, e.g. pods (repeatable)",
	"time-travel-guard":                 "never let a lagging apiserver answer a list with older data",
	"watch-resume-timeout":              "how long a broken upstream watch is retried",
	"watch-stall-timeout":               "resume an upstream watch that sent nothing for this long",
	"watch-write-timeout":               "end a watch whose client does not read what it is sent this long",
	"watch-max-lifetime":                "end a client watch cleanly after about this long (it re-watches)",
	"watch-absorb-gone":                 "answer a 410 at a resume point with only what changed",
	"watch-absorb-state-bytes":          "bytes of state one watch may keep to absorb a 410",
	"watch-absorb-total-bytes":          "bytes of state all watches may keep together",
	"watch-absorb-complete-by-list":     "list at a client's resourceVersion so that its watch can absorb too",
	"retry-budget":                      "how long a failed request is retried; 0: no retries",
	"watch-lag-timeout":                 "move a watch this far behind another upstream's; 0: never",
	"watch-rebalance-rate":              "watches moved per second to even out upstreams; 0: never",
	"watch-drain-rate":                  "watches moved per second off a degraded upstream; 0: all at once",
	"share-watches":                     "serve identical watches from one upstream watch, a shared feed",
	"share-ring-bytes":                  "bytes of recent events a shared feed keeps for re-watching clients",
	"share-ring-total-bytes":            "bytes all shared feeds' rings keep together; 0: auto",
	"memory-budget-bytes":               "bytes everything that grows with load may hold together; 0: auto",
	"coalesce-reads":                    "serve identical lists and discovery reads from one upstream read",
	"coalesce-lag-bytes":                "bytes a client of a coalesced read may fall behind the fastest",
	"coalesce-max-groups":               "distinct coalesced reads at once",
	"coalesce-max-members":              "clients one coalesced read serves at most",
	"coalesce-total-bytes":              "bytes all coalesced reads buffer together",
	"share-ring-events":                 "events a shared feed keeps at most",
	"share-subscriber-buffer-bytes":     "bytes a shared feed's client may fall behind before it is ended",
	"share-exclude-resource":            "resource whose watches never share a feed (repeatable)",
	"share-access-review-cache-entries": "access review denials kept, for 30 seconds",
	"share-max-feeds":                   "shared feeds open at most",
	"share-reviewed-watch-lists":        "let reviewed clients' watch-lists move onto shared feeds",
	"shutdown-delay":                    "on SIGTERM, how long /readyz fails before the listeners close",
	"access-log":                        "log one line per request on the main listener",
	"v":                                 "klog-style verbosity: 0 is --log-level=info, 1 or more debug",
}

// helpLineWidth is how long a flag's description in --help may be before it is cut.
const helpLineWidth = 72

// ShortUsage is f's description for --help: its short usage when it has one, else its usage,
// cut after the first clause if that is longer than a line.
func ShortUsage(f *pflag.Flag) string {
	if s := f.Annotations[ShortUsageAnnotation]; len(s) == 1 && s[0] != "" {
		return s[0]
	}
	u := f.Usage
	if len(u) <= helpLineWidth {
		return u
	}
	for _, sep := range []string{"; ", ". ", " ("} {
		if i := strings.Index(u, sep); i >= 20 && i <= helpLineWidth {
			return u[:i]
		}
	}
	cut := strings.LastIndex(u[:helpLineWidth], " ")
	if cut < 20 {
		cut = helpLineWidth
	}
	return u[:cut] + " ..."
}

// annotateShortUsage puts shortUsage on fs's flags.
func annotateShortUsage(fs *pflag.FlagSet) {
	for name, s := range shortUsage {
		if s != "" && fs.Lookup(name) != nil {
			_ = fs.SetAnnotation(name, ShortUsageAnnotation, []string{s})
		}
	}
}

package e2e

// Errors that name their cause (docs/design.md section 10.10): an upstream watchsan cannot use
// says why at every place an operator looks: /readyz (and ?verbose), the 503 a client gets
// when no upstream is usable, and one log line at the change of state, not one per probe.

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/test/cluster"
)

// TestErrorsNameTheirCause runs watchsan against a real apiserver it does not trust (a CA that
// did not sign its certificate), a port nothing listens on, and a real apiserver that refuses
// watchsan's own token (401); each time the cause must be named by /readyz, the client's
// answer and the log, and logged once however many probes fail.
func TestErrorsNameTheirCause(t *testing.T) {
	c := newCluster(t, cluster.Options{APIServers: 1})
	a := c.APIServers[0]
	dir := t.TempDir()
	wrongCA, err := cluster.NewCA(dir, "not-the-apiservers-ca")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "https://" + ln.Addr().String()
	ln.Close()
	badToken := filepath.Join(dir, "revoked.kubeconfig")
	if err := c.WriteKubeconfig(badToken, a.URL, "revoked-token-of-watchsan", c.CAFile); err != nil {
		t.Fatal(err)
	}
	common := []string{"--health-interval=100ms", "--health-probe-interval=100ms", "--retry-budget=1s", "--log-level=info"}

	for _, tc := range []struct {
		name, upstream string
		args           []string
		cause          string   // the log line's cause field
		want           []string // in /readyz, the client's answer and the log line
		// degraded: the upstream answers (a 401 to watchsan's own token): watchsan stays ready
		// on it and the client gets the apiserver's own answer, not a 503.
		degraded bool
	}{
		{name: "wrong CA", upstream: a.URL, args: []string{"--upstream-ca-file=" + wrongCA.File, "--no-credentials"},
			cause: "tls", want: []string{"tls: ", "x509: certificate signed by unknown authority", "--upstream-ca-file"}},
		{name: "refused", upstream: refused, args: []string{"--upstream-ca-file=" + c.CAFile, "--no-credentials"},
			cause: "refused", want: []string{"refused: ", "connection refused", ln.Addr().String()}},
		{name: "own token refused", upstream: a.URL, args: []string{"--kubeconfig=" + badToken},
			cause: "unauthorized", want: []string{"unauthorized: /readyz answered 401 to the lent identity", "token expired or revoked"}, degraded: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startProxy(t, append(append([]string{"--upstream=" + tc.upstream}, tc.args...), common...)...)
			hasAll := func(s string) bool {
				for _, w := range tc.want {
					if !strings.Contains(s, w) {
						return false
					}
				}
				return true
			}
			// /readyz: 503 naming the cause; or, on a degraded upstream, ready but saying why
			// none is healthy.
			var body string
			var code int
			eventually(t, 20*time.Second, "/readyz to name the cause", func() bool {
				code, body = get(t, p.AdminURL+"/readyz")
				return hasAll(body)
			})
			t.Logf("%s: /readyz %d %q", tc.name, code, body)
			wantCode := 503
			if tc.degraded {
				wantCode = 200
			}
			if code != wantCode || !strings.Contains(body, tc.upstream) {
				t.Errorf("/readyz answered %d %q, want %d naming %s", code, body, wantCode, tc.upstream)
			}
			code, verbose := get(t, p.AdminURL+"/readyz?verbose")
			t.Logf("%s: /readyz?verbose %d %q", tc.name, code, verbose)
			if code != wantCode || !hasAll(verbose) || !strings.Contains(verbose, "[-]upstream "+tc.upstream+" ") {
				t.Errorf("/readyz?verbose answered %d %q, want a [-] line for %s naming the cause", code, verbose, tc.upstream)
			}

			// The client's answer.
			resp, err := http.Get(p.URL + "/api/v1/namespaces/default/configmaps")
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			var st metav1.Status
			if err := json.Unmarshal(raw, &st); err != nil {
				t.Fatalf("the client's answer (%d) is not a Status: %v: %s", resp.StatusCode, err, raw)
			}
			t.Logf("%s: client got %d %q", tc.name, resp.StatusCode, st.Message)
			if tc.degraded {
				// The apiserver's own 401 to the lent token, passed as it came, with a Warning
				// (kubectl and client-go print it) naming whose credentials were refused.
				w := resp.Header.Get("Warning")
				t.Logf("%s: client got Warning %s", tc.name, w)
				if resp.StatusCode != 401 || st.Reason != metav1.StatusReasonUnauthorized || !strings.Contains(w, "refused the credentials watchsan lends (401)") {
					t.Errorf("client got %d %+v Warning %q, want the apiserver's 401 with a Warning naming watchsan's lent credentials", resp.StatusCode, st, w)
				}
			} else if resp.StatusCode != 503 || !hasAll(st.Message) || !strings.Contains(st.Message, "every upstream apiserver is unavailable") {
				t.Errorf("client got %d %q, want a 503 naming the cause %v", resp.StatusCode, st.Message, tc.want)
			}

			// The log: one line at the change of state, with the cause, however many checks
			// failed since (every 100 ms; each dials again: a failed handshake or dial, and a 401,
			// which the apiserver answers with Connection: close).
			eventually(t, 30*time.Second, "20 health checks", func() bool {
				return p.Metric(dialsMetric, map[string]string{"connection": "health"}) >= 20
			})
			state := "upstream unhealthy"
			if tc.degraded {
				state = "upstream degraded: it answers, but not ready; used only while no healthy upstream is left, its watches move"
			}
			lines := matching(p, state, tc.upstream)
			if len(lines) != 1 {
				t.Fatalf("%d %q lines for %s, want exactly 1:\n%s", len(lines), state, tc.upstream, strings.Join(lines, "\n"))
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: log %s", tc.name, lines[0])
			if m["cause"] != tc.cause || !hasAll(fmt.Sprint(m["error"])) {
				t.Errorf("log line %s: want cause %q and an error naming %v", lines[0], tc.cause, tc.want)
			}
			requireNoPanic(t, p)
		})
	}
}

// get returns the status and body (at most 1 MiB) of GET u.
func get(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// matching returns p's JSON log lines whose msg is msg and, when upstream is not empty, whose
// upstream field is upstream.
func matching(p *proxy, msg, upstream string) []string {
	var out []string
	for _, line := range p.logLines() {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil || m["msg"] != msg {
			continue
		}
		if upstream != "" && m["upstream"] != upstream {
			continue
		}
		out = append(out, line)
	}
	return out
}

package server

import (
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const monitoringDir = "../../deploy/monitoring/"

type ruleGroups struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

var metricName = regexp.MustCompile(`\bwatchsan_[a-z0-9_]+`)

// checkExpr fails on a watchsan metric the registry does not have (a histogram's _bucket,
// _sum and _count included) and on unbalanced brackets or quotes: without Prometheus's own
// parser (a heavy dependency), what a renamed metric or a broken edit would get wrong.
func checkExpr(t *testing.T, where, expr string, known map[string]string) {
	t.Helper()
	if strings.TrimSpace(expr) == "" {
		t.Errorf("%s: empty expression", where)
		return
	}
	for _, n := range metricName.FindAllString(expr, -1) {
		if _, ok := known[n]; ok {
			continue
		}
		base := n
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			base = strings.TrimSuffix(base, suf)
		}
		if known[base] != "histogram" || base == n {
			t.Errorf("%s: %s is not a watchsan metric (docs/metrics.md): %s", where, n, expr)
		}
	}
	var stack []rune
	inQuote := false
	for _, c := range expr {
		switch {
		case c == '"':
			inQuote = !inQuote
		case inQuote:
		case c == '(' || c == '[' || c == '{':
			stack = append(stack, c)
		case c == ')' || c == ']' || c == '}':
			open := map[rune]rune{')': '(', ']': '[', '}': '{'}[c]
			if len(stack) == 0 || stack[len(stack)-1] != open {
				t.Errorf("%s: unbalanced %q: %s", where, c, expr)
				return
			}
			stack = stack[:len(stack)-1]
		}
	}
	if inQuote || len(stack) > 0 {
		t.Errorf("%s: unclosed quote or bracket: %s", where, expr)
	}
}

func knownMetrics(t *testing.T) map[string]string {
	docs, _ := metricsReference(t)
	known := map[string]string{}
	for _, d := range docs {
		known[d.name] = d.typ
	}
	return known
}

// TestAlertRules: every alert names metrics the registry has, parses as far as brackets go,
// has a severity and a summary; the plain rule file and the PrometheusRule hold the same
// groups; the alerts the operations guide promises exist.
func TestAlertRules(t *testing.T) {
	known := knownMetrics(t)
	var plain ruleGroups
	readYAML(t, monitoringDir+"prometheus-rules.yaml", &plain)
	var pr struct {
		Kind string     `json:"kind"`
		Spec ruleGroups `json:"spec"`
	}
	readYAML(t, monitoringDir+"prometheusrule.yaml", &pr)
	if pr.Kind != "PrometheusRule" || !reflect.DeepEqual(pr.Spec, plain) {
		t.Fatalf("prometheusrule.yaml (kind %q) does not hold the groups of prometheus-rules.yaml", pr.Kind)
	}
	alerts := map[string]bool{}
	for _, g := range plain.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = true
			checkExpr(t, r.Alert, r.Expr, known)
			if sev := r.Labels["severity"]; sev != "info" && sev != "warning" && sev != "critical" { // the Prometheus Operator's levels
				t.Errorf("%s: severity %q", r.Alert, sev)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: no summary or description", r.Alert)
			}
		}
	}
	for _, want := range []string{"WatchsanRegressionsRepaired", "WatchsanResumesFailing", "WatchsanWatchStalls", "WatchsanUpstreamDown", "WatchsanNoUsableUpstream", "WatchsanForcedRelists"} {
		if !alerts[want] {
			t.Errorf("alert %s is missing", want)
		}
	}
	guide, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for a := range alerts {
		if !strings.Contains(string(guide), a) {
			t.Errorf("docs/operations.md does not explain alert %s", a)
		}
	}
}

// TestDashboard: every panel query names metrics the registry has and parses as far as
// brackets go, and the dashboard shows every watchsan metric.
func TestDashboard(t *testing.T) {
	known := knownMetrics(t)
	b, err := os.ReadFile(monitoringDir + "grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	shown := map[string]bool{}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			checkExpr(t, "panel "+p.Title, tg.Expr, known)
			for _, n := range metricName.FindAllString(tg.Expr, -1) {
				shown[strings.TrimSuffix(n, "_bucket")] = true
			}
		}
	}
	for n := range known {
		if !shown[n] {
			t.Errorf("the dashboard shows no panel of %s", n)
		}
	}
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

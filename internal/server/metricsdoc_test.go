package server

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/watchsan/watchsan/internal/budget"
	"github.com/watchsan/watchsan/internal/metrics"
)

var updateMetricsDoc = flag.Bool("update-metrics-doc", false, "rewrite docs/metrics.md from the registry")

const metricsDocPath = "../../docs/metrics.md"

// labelNotes say what an open label holds; a label without a note must have its closed set of
// values created at start (so that it appears in the reference, and alerts see 0).
var labelNotes = map[string]string{
	"resource":  "`group/resource` (`configmaps`, `apps/deployments`), `\"\"` for non-resource paths; up to 500 resources the upstream has answered with 2xx (or 101) and the first 100 others; beyond those, `other`",
	"verb":      "the apiserver's verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`, `proxy`) or lower-case method on other paths (`head`, `post`, `put`, `options`), else `other`",
	"code":      "the HTTP status code answered; `499` when the client went away before any answer (nginx's code)",
	"upstream":  "an upstream URL from `--upstream` or discovery; its series go when it is forgotten",
	"type":      "`ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`, `ERROR`, `other`",
	"action":    "`passed`, `rewritten`, `dropped` (in observe mode: what repair would have done)",
	"version":   "`-ldflags` version, else the module version",
	"revision":  "VCS revision of the build, `unknown` without one",
	"goversion": "Go version of the build",
	"listener":  "`main`, `admin` (set when the listener starts)",
}

type metricDoc struct {
	name, typ, help string
	labels          []string
	values          map[string][]string // closed label values created at start
	buckets         []float64
}

// metricsReference documents every watchsan_* metric: name, type, help and labels, from a
// registry filled the way a running server fills it, with each closed label's values.
func metricsReference(t *testing.T) ([]metricDoc, string) {
	t.Helper()
	s, _ := newTestServer(t, "http://127.0.0.1:1")
	initial := gather(t, s.metrics.Registry)

	// A fresh registry with one series in every vector, for the families that have none
	// until used (their labels are open).
	m := metrics.New(func() float64 { return 0 })
	touchAll(t, reflect.ValueOf(m).Elem())
	m.Registry.MustRegister(budget.New(0)) // the server registers the memory budget's own
	m.Upstream.Source(func() []metrics.UpstreamSample {
		return []metrics.UpstreamSample{{Name: "u", State: "healthy", States: []string{"healthy"}}}
	})
	var docs []metricDoc
	fams, err := m.Registry.Gather() // sorted by name
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), "watchsan_") {
			continue
		}
		d := metricDoc{name: f.GetName(), typ: strings.ToLower(f.GetType().String()), help: f.GetHelp(), values: map[string][]string{}}
		for _, l := range f.GetMetric()[0].GetLabel() {
			d.labels = append(d.labels, l.GetName())
		}
		if h := f.GetMetric()[0].GetHistogram(); h != nil {
			for _, b := range h.GetBucket() {
				d.buckets = append(d.buckets, b.GetUpperBound())
			}
		}
		if g := initial[f.GetName()]; g != nil {
			for _, mm := range g.GetMetric() {
				for _, l := range mm.GetLabel() {
					if _, open := labelNotes[l.GetName()]; !open && !slices.Contains(d.values[l.GetName()], l.GetValue()) {
						d.values[l.GetName()] = append(d.values[l.GetName()], l.GetValue())
					}
				}
			}
		}
		for _, l := range d.labels {
			if _, open := labelNotes[l]; !open && len(d.values[l]) == 0 {
				t.Errorf("%s: label %q has no values at start and no note in labelNotes: create its closed set in server.New (alerts need 0, not no data) or describe it", d.name, l)
			}
			sort.Strings(d.values[l])
		}
		docs = append(docs, d)
	}
	return docs, renderMetricsDoc(docs)
}

func gather(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

var variableLabels = regexp.MustCompile(`variableLabels: \{([^}]*)\}`)

// touchAll creates one series in every metric vector among v's fields (and nested structs').
func touchAll(t *testing.T, v reflect.Value) {
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		if !f.CanInterface() {
			continue
		}
		if f.Kind() == reflect.Struct {
			touchAll(t, f)
			continue
		}
		c, ok := f.Interface().(prometheus.Collector)
		if _, reg := c.(*prometheus.Registry); !ok || reg || f.IsNil() {
			continue
		}
		ch := make(chan *prometheus.Desc, 64)
		c.Describe(ch)
		close(ch)
		d := <-ch
		mt := variableLabels.FindStringSubmatch(d.String())
		if mt == nil || mt[1] == "" {
			continue
		}
		vals := make([]string, len(strings.Split(mt[1], ",")))
		for j := range vals {
			vals[j] = "x"
		}
		switch vec := c.(type) {
		case *prometheus.CounterVec:
			vec.WithLabelValues(vals...)
		case *prometheus.GaugeVec:
			vec.WithLabelValues(vals...)
		case *prometheus.HistogramVec:
			vec.WithLabelValues(vals...)
		default:
			t.Fatalf("field %s: a %T the reference cannot fill", v.Type().Field(i).Name, c)
		}
	}
}

func renderMetricsDoc(docs []metricDoc) string {
	var b bytes.Buffer
	b.WriteString("# watchsan metrics reference\n\n")
	b.WriteString("Generated from the registry by `go test ./internal/server -run TestMetricsReference -update-metrics-doc`;\n")
	b.WriteString("the same test fails when this file and the code differ. What to do about each is in\n")
	b.WriteString("[operations.md](operations.md#metrics). Served on the admin listener's `/metrics`, next to the Go\n")
	b.WriteString("runtime's `go_*` and the process's `process_*` metrics.\n\n")
	b.WriteString("Every label takes values from a closed set. Values listed exist from the start at 0 (alerts\n")
	b.WriteString("see 0, not \"no data\"); series with open labels (`resource`, `verb`, `code`) appear when first used.\n\n")
	for _, d := range docs {
		fmt.Fprintf(&b, "## %s\n\n%s. %s\n\n", d.name, d.typ, d.help)
		for _, l := range d.labels {
			if note, open := labelNotes[l]; open {
				fmt.Fprintf(&b, "- `%s`: %s\n", l, note)
			} else {
				q := make([]string, len(d.values[l]))
				for i, v := range d.values[l] {
					q[i] = "`" + v + "`"
				}
				fmt.Fprintf(&b, "- `%s`: %s\n", l, strings.Join(q, ", "))
			}
		}
		if len(d.buckets) > 0 {
			bs := make([]string, len(d.buckets))
			for i, v := range d.buckets {
				bs[i] = strconv.FormatFloat(v, 'g', -1, 64)
			}
			fmt.Fprintf(&b, "- buckets (seconds): %s\n", strings.Join(bs, ", "))
		}
		if len(d.labels) > 0 || len(d.buckets) > 0 {
			b.WriteString("\n")
		}
	}
	return b.String()
}

// TestMetricsReference: docs/metrics.md is what the code registers.
func TestMetricsReference(t *testing.T) {
	_, doc := metricsReference(t)
	if *updateMetricsDoc {
		if err := os.WriteFile(metricsDocPath, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	have, err := os.ReadFile(metricsDocPath)
	if err != nil {
		t.Fatal(err)
	}
	if string(have) != doc {
		t.Fatalf("docs/metrics.md differs from the registry; run go test ./internal/server -run TestMetricsReference -update-metrics-doc\n--- want:\n%s", doc)
	}
}

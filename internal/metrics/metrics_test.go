package metrics

import (
	"runtime"
	"strconv"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// TestHistogramBoundsAreRound: every bucket bound prints as written (le="0.25"), not as the
// float arithmetic of generated buckets (le="3.6450000000000005").
func TestHistogramBoundsAreRound(t *testing.T) {
	m := New(nil)
	m.RequestSeconds.WithLabelValues("get", "pods").Observe(0.1)
	m.ResumeSeconds.Observe(0.1)
	m.ResumeBrake.Observe(0.1)
	m.Upstream.Detection.WithLabelValues("u", "lagging").Observe(1)
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, f := range fams {
		if f.GetType() != dto.MetricType_HISTOGRAM || len(f.GetName()) < 9 || f.GetName()[:9] != "watchsan_" {
			continue
		}
		seen++
		for _, b := range f.GetMetric()[0].GetHistogram().GetBucket() {
			if s := strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64); len(s) > 5 {
				t.Errorf("%s: bucket bound prints as le=%q", f.GetName(), s)
			}
		}
	}
	if seen != 4 {
		t.Errorf("checked %d watchsan histograms, want 4 (a new one needs an observation above)", seen)
	}
}

// TestSeriesExistBeforeUse: build_info and the closed-set series are there at 0 before
// anything happened, so alerts and dashboards see 0 rather than "no data".
func TestSeriesExistBeforeUse(t *testing.T) {
	m := New(nil)
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	bi := byName["watchsan_build_info"]
	if bi == nil || len(bi.GetMetric()) != 1 || bi.GetMetric()[0].GetGauge().GetValue() != 1 {
		t.Fatalf("watchsan_build_info: %v", bi)
	}
	labels := map[string]string{}
	for _, l := range bi.GetMetric()[0].GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["goversion"] != runtime.Version() || labels["version"] == "" || labels["revision"] == "" {
		t.Errorf("build_info labels %v", labels)
	}
	m.SetVersion("v1.2.3", "0123456789abcdef")
	if n := len(mustFamily(t, m, "watchsan_build_info").GetMetric()); n != 1 {
		t.Errorf("SetVersion left %d build_info series, want 1", n)
	}
	if got := mustFamily(t, m, "watchsan_build_info").GetMetric()[0].GetLabel(); got[2].GetName() != "version" || got[2].GetValue() != "v1.2.3" ||
		got[1].GetName() != "revision" || got[1].GetValue() != "0123456789abcdef" {
		t.Errorf("after SetVersion: %v", got)
	}
	if n := len(byName["watchsan_bytes_total"].GetMetric()); n != len(Directions) {
		t.Errorf("watchsan_bytes_total has %d series before any request, want %d", n, len(Directions))
	}
}

func mustFamily(t *testing.T, m *Metrics, name string) *dto.MetricFamily {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f
		}
	}
	t.Fatalf("no %s", name)
	return nil
}

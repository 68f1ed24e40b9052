package demo

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/watchsan/watchsan/internal/faults"
	"github.com/watchsan/watchsan/internal/server"
)

// Write is one event of the apiserver's own watch stream: what really happened.
type Write struct {
	Type string // ADDED, MODIFIED or DELETED
	Name string
	RV   string
}

// Verdict is how a handler call compares with what the apiserver did.
type Verdict int

const (
	// Faithful: the call reports a write the apiserver made, the first time.
	Faithful Verdict = iota
	// WentBack: a faithful delete whose resourceVersion is below one the informer saw before
	// (the bug itself; the informer's next re-watch starts from there).
	WentBack
	// Replay: an OnAdd or OnUpdate for a write the informer had already been told about.
	Replay
	// DeletedAgain: an OnDelete for an object whose delete the informer had already been told
	// about.
	DeletedAgain
	// Unexplained: a call that matches no write at all.
	Unexplained
)

func (v Verdict) String() string {
	switch v {
	case Faithful:
		return "faithful"
	case WentBack:
		return "went-back"
	case Replay:
		return "replay"
	case DeletedAgain:
		return "deleted-again"
	case Unexplained:
		return "unexplained"
	}
	return "Verdict(" + strconv.Itoa(int(v)) + ")"
}

// Side is what one informer's handlers saw, judged.
type Side struct {
	Title string
	Calls []Call
	// Counts of calls by verdict other than Faithful.
	WentBack, Replays, DeletedAgain, Unexplained int
	// Missing lists the writes the handlers never heard of ("DELETED a rv 9").
	Missing []string
	// StoreMatches says whether the informer's store at the end held exactly the objects, at
	// the same resourceVersions, that a fresh list from the apiserver returned; StoreDiff
	// says how they differ when not.
	StoreMatches bool
	StoreDiff    string
}

// Deletes returns how many times OnDelete was called for name.
func (s *Side) Deletes(name string) int {
	n := 0
	for _, c := range s.Calls {
		if c.Handler == OnDelete && c.Name == name {
			n++
		}
	}
	return n
}

// Counters are watchsan's own metrics at the end of the run.
type Counters struct {
	// Events is watchsan_watch_events_total summed over resources: type -> action -> count.
	Events map[string]map[string]float64
	// StreamsRegressed is watchsan_watch_streams_regressed_total.
	StreamsRegressed float64
	// RememberedDeletes is watchsan_delete_memory_entries.
	RememberedDeletes float64
	// Resumes is watchsan_watch_resumes_total by reason.
	Resumes map[string]float64
	// RelistsForced is watchsan_watch_relists_forced_total.
	RelistsForced float64
}

// Action returns the count of events of typ with action (passed, rewritten, dropped).
func (c Counters) Action(typ, action string) float64 { return c.Events[typ][action] }

// Result is what a run observed.
type Result struct {
	Upstream string
	// Deleted is the object whose delete the bug sends back in time.
	Deleted string
	Truth   []Write
	// Other are writes to other resources, not watched (they take resourceVersions too).
	Other   []Write
	Direct  Side // the informer reading the faulty apiserver directly
	Through Side // the informer reading it through watchsan
	// Faults are the fault layers' counts: [0] in front of the direct informer, [1] in
	// front of watchsan.
	Faults   [2]faults.Stats
	Counters Counters
	Elapsed  time.Duration
}

// Problems lists every way the run failed to show what it should: the direct informer
// replayed and deleted twice, the one through watchsan saw exactly the truth. Empty: it did.
func (r *Result) Problems() []string {
	var p []string
	d, t := &r.Direct, &r.Through
	if d.Replays == 0 {
		p = append(p, "the direct informer saw no replayed event: the fault layer did not reproduce the bug")
	}
	if n := d.Deletes(r.Deleted); n < 2 {
		p = append(p, fmt.Sprintf("the direct informer was told %d time(s) that %s was deleted, not twice", n, r.Deleted))
	}
	if n := t.Deletes(r.Deleted); n != 1 {
		p = append(p, fmt.Sprintf("through watchsan the informer was told %d time(s) that %s was deleted, not once", n, r.Deleted))
	}
	if t.WentBack+t.Replays+t.DeletedAgain+t.Unexplained > 0 {
		p = append(p, fmt.Sprintf("through watchsan the informer saw %d event(s) the apiserver did not send at that point (%d went back, %d replays, %d repeated deletes, %d unexplained)",
			t.WentBack+t.Replays+t.DeletedAgain+t.Unexplained, t.WentBack, t.Replays, t.DeletedAgain, t.Unexplained))
	}
	if len(t.Missing) > 0 {
		p = append(p, "through watchsan the informer missed: "+strings.Join(t.Missing, ", "))
	}
	if !t.StoreMatches {
		p = append(p, "through watchsan the informer's store differs from a fresh list: "+t.StoreDiff)
	}
	return p
}

// OK says whether the run showed what it should.
func (r *Result) OK() bool { return len(r.Problems()) == 0 }

// judge compares an informer's handler calls with the truth.
func judge(title string, inf *informer, truth []Write) Side {
	s := Side{Title: title, Calls: inf.rec.snapshot()}
	told := make([]bool, len(truth)) // the informer was told about truth[i]
	prevRV := func(name string, before int) string {
		for i := before - 1; i >= 0; i-- {
			if truth[i].Name == name && truth[i].Type != "DELETED" {
				return truth[i].RV
			}
		}
		return ""
	}
	var highest uint64 // the highest RV any handler call carried so far
	for i := range s.Calls {
		c := &s.Calls[i]
		rv, rvOK := parseRV(c.RV)
		switch {
		case c.InitialList:
			c.Verdict = Faithful
		case c.Handler == OnDelete:
			j := slices.IndexFunc(truth, func(w Write) bool { return w.Type == "DELETED" && w.Name == c.Name })
			switch {
			case j < 0:
				c.Verdict, c.Note = Unexplained, "the apiserver deleted no such object"
			case told[j]:
				c.Verdict, c.Note = DeletedAgain, "DELETED AGAIN"
				c.Truth = j
			default:
				told[j], c.Truth = true, j
				switch {
				case rvOK && rv < highest:
					c.Verdict = WentBack
					c.Note = fmt.Sprintf("rv went back (%d seen before)", highest)
				case c.RV != truth[j].RV:
					c.Note = fmt.Sprintf("(watchsan rewrote the rv %s the upstream sent)", prevRV(c.Name, j))
				}
			}
		default: // OnAdd, OnUpdate
			j := slices.IndexFunc(truth, func(w Write) bool { return w.Type != "DELETED" && w.Name == c.Name && w.RV == c.RV })
			switch {
			case j < 0:
				c.Verdict, c.Note = Unexplained, "the apiserver made no such write"
			case told[j]:
				c.Verdict, c.Truth = Replay, j
				c.Note = "REPLAY"
				if old, ok := parseRV(c.OldRV); ok && rvOK && old > rv {
					c.Note = fmt.Sprintf("REPLAY: %s went back from rv %d", c.Name, old)
				}
			default:
				told[j], c.Truth = true, j
			}
		}
		switch c.Verdict {
		case WentBack:
			s.WentBack++
		case Replay:
			s.Replays++
		case DeletedAgain:
			s.DeletedAgain++
		case Unexplained:
			s.Unexplained++
		}
		if rvOK && rv > highest {
			highest = rv
		}
	}
	for j, w := range truth {
		if !told[j] {
			s.Missing = append(s.Missing, fmt.Sprintf("%s %s rv %s", w.Type, w.Name, w.RV))
		}
	}
	return s
}

func parseRV(rv string) (uint64, bool) {
	n, err := strconv.ParseUint(rv, 10, 64)
	return n, err == nil
}

// compareStore sets StoreMatches and StoreDiff from an informer's store and a fresh list.
func (s *Side) compareStore(store cache.Store, listed []corev1.Service) {
	have := map[string]string{}
	for _, o := range store.List() {
		if svc, ok := o.(*corev1.Service); ok {
			have[svc.Name] = svc.ResourceVersion
		}
	}
	want := map[string]string{}
	for _, svc := range listed {
		want[svc.Name] = svc.ResourceVersion
	}
	var diffs []string
	for _, name := range slices.Sorted(maps.Keys(want)) {
		switch rv, ok := have[name]; {
		case !ok:
			diffs = append(diffs, name+" missing")
		case rv != want[name]:
			diffs = append(diffs, fmt.Sprintf("%s at rv %s, not %s", name, rv, want[name]))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(have)) {
		if _, ok := want[name]; !ok {
			diffs = append(diffs, name+" should not be there")
		}
	}
	s.StoreMatches = len(diffs) == 0
	s.StoreDiff = strings.Join(diffs, "; ")
}

// openWatches returns watchsan_open_watches summed over resources.
func openWatches(srv *server.Server) float64 {
	families, _ := srv.Metrics().Registry.Gather()
	n := 0.0
	for _, f := range families {
		if f.GetName() == "watchsan_open_watches" {
			for _, m := range f.GetMetric() {
				n += m.GetGauge().GetValue()
			}
		}
	}
	return n
}

// readCounters reads watchsan's counters from its registry.
func readCounters(srv *server.Server) Counters {
	c := Counters{Events: map[string]map[string]float64{}, Resumes: map[string]float64{}}
	// On an error Gather still returns every family it could gather.
	families, _ := srv.Metrics().Registry.Gather()
	label := func(m *dto.Metric, name string) string {
		for _, l := range m.GetLabel() {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			switch f.GetName() {
			case "watchsan_watch_events_total":
				typ, action := label(m, "type"), label(m, "action")
				if c.Events[typ] == nil {
					c.Events[typ] = map[string]float64{}
				}
				c.Events[typ][action] += v
			case "watchsan_watch_streams_regressed_total":
				c.StreamsRegressed += v
			case "watchsan_delete_memory_entries":
				c.RememberedDeletes += v
			case "watchsan_watch_resumes_total":
				c.Resumes[label(m, "reason")] += v
			case "watchsan_watch_relists_forced_total":
				c.RelistsForced += v
			}
		}
	}
	return c
}

// WriteReport writes the side-by-side report for a person in a terminal.
func (r *Result) WriteReport(w io.Writer) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("watchsan-demo: DELETED watch events that go back in time (Kubernetes 1.7.0-1.9.2, kubernetes#58545)\n\n")
	p("Upstream: %s, behind a fault layer with the 1.7 bug:\n", r.Upstream)
	p("every DELETED event carries the object's previous resourceVersion, and the watch ends right\n")
	p("after it (what a reflector's re-watch every 5-10 minutes would do, only now).\n")
	p("Two client-go shared informers watch services in %q: one reads that upstream directly,\n", Namespace)
	p("the other through watchsan. Steps: create a, create others, update one, delete a, wait\n")
	p("until both watches were re-established, create %q.\n\n", markerName)

	p("What the apiserver did (its own watch stream, no faults):\n")
	all := append(slices.Clone(r.Truth), r.Other...)
	slices.SortStableFunc(all, func(a, b Write) int {
		x, _ := parseRV(a.RV)
		y, _ := parseRV(b.RV)
		return cmp.Compare(x, y)
	})
	for _, t := range all {
		note := ""
		if slices.Contains(r.Other, t) {
			note = "   (another resource: not in the services watch, but it takes a resourceVersion)"
		}
		p("    rv %-6s %-9s %s%s\n", t.RV, t.Type, t.Name, note)
	}
	p("\n")

	left, right := r.Direct.cells(), r.Through.cells()
	rows := pairRows(r.Direct.Calls, r.Through.Calls, left, right)
	lw := len("WITHOUT WATCHSAN (direct)")
	for _, row := range rows {
		lw = max(lw, len(row[0]))
	}
	p("What each informer's event handlers were called with:\n")
	p("    %-*s | %s\n", lw, "WITHOUT WATCHSAN (direct)", "THROUGH WATCHSAN")
	p("    %s-+-%s\n", strings.Repeat("-", lw), strings.Repeat("-", 40))
	for _, row := range rows {
		p("    %-*s | %s\n", lw, row[0], row[1])
	}
	p("\n")

	side := func(s *Side) string {
		var parts []string
		if s.WentBack > 0 {
			parts = append(parts, fmt.Sprintf("%d delete went back in time", s.WentBack))
		}
		if s.Replays > 0 {
			parts = append(parts, fmt.Sprintf("%d replayed add/update", s.Replays))
		}
		if s.DeletedAgain > 0 {
			parts = append(parts, fmt.Sprintf("%d repeated delete", s.DeletedAgain))
		}
		if s.Unexplained > 0 {
			parts = append(parts, fmt.Sprintf("%d unexplained", s.Unexplained))
		}
		if len(s.Missing) > 0 {
			parts = append(parts, fmt.Sprintf("%d missed", len(s.Missing)))
		}
		if len(parts) == 0 {
			parts = append(parts, "exactly the apiserver's writes, each once, in order")
		}
		store := "equals a fresh list"
		if !s.StoreMatches {
			store = "DIFFERS from a fresh list: " + s.StoreDiff
		}
		return fmt.Sprintf("%d handler calls: %s; store %s", len(s.Calls), strings.Join(parts, ", "), store)
	}
	p("Without watchsan: %s.\n", side(&r.Direct))
	p("Through watchsan: %s.\n\n", side(&r.Through))

	c := r.Counters
	p("watchsan's counters (from its Prometheus registry):\n")
	p("    %-42s %s\n", "watchsan_watch_events_total", c.eventsLine())
	p("    %-42s %g\n", "watchsan_watch_streams_regressed_total", c.StreamsRegressed)
	p("    %-42s %g\n", "watchsan_delete_memory_entries", c.RememberedDeletes)
	p("    %-42s %s\n", "watchsan_watch_resumes_total", byKey(c.Resumes))
	p("    %-42s %g\n", "watchsan_watch_relists_forced_total", c.RelistsForced)
	p("The fault layers sent %d DELETED event(s) back in time to the direct informer and %d to watchsan,\n",
		r.Faults[0].DeletesRewritten, r.Faults[1].DeletesRewritten)
	p("and ended %d and %d watch(es) right after a delete.\n\n", r.Faults[0].EndedAfterDelete, r.Faults[1].EndedAfterDelete)

	if probs := r.Problems(); len(probs) > 0 {
		p("VERDICT: the demo did NOT show what it should:\n")
		for _, pr := range probs {
			p("  - %s\n", pr)
		}
	} else {
		d := &r.Direct
		p("VERDICT: without watchsan the informer's handlers were called %d time(s) for events the apiserver did not send then (%s deleted %d times); through watchsan they saw exactly the truth. (%.1fs)\n",
			d.Replays+d.DeletedAgain, r.Deleted, d.Deletes(r.Deleted), r.Elapsed.Seconds())
	}
}

func (c Counters) eventsLine() string {
	var parts []string
	order := []string{"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"}
	for _, t := range slices.Sorted(maps.Keys(c.Events)) {
		if !slices.Contains(order, t) {
			order = append(order, t)
		}
	}
	for _, t := range order {
		for _, a := range []string{"passed", "rewritten", "dropped"} {
			if v := c.Events[t][a]; v > 0 {
				parts = append(parts, fmt.Sprintf("%s %s %g", t, a, v))
			}
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func byKey(m map[string]float64) string {
	total := 0.0
	var parts []string
	keys := slices.Collect(maps.Keys(m))
	sort.Strings(keys)
	for _, k := range keys {
		total += m[k]
		parts = append(parts, fmt.Sprintf("%s %g", k, m[k]))
	}
	if len(parts) == 0 {
		return "0"
	}
	return fmt.Sprintf("%g (%s)", total, strings.Join(parts, ", "))
}

// cells renders each call as one table cell.
func (s *Side) cells() []string {
	out := make([]string, len(s.Calls))
	for i, c := range s.Calls {
		cell := fmt.Sprintf("%-8s %-8s rv %-5s", c.Handler, c.Name, c.RV)
		if c.InitialList {
			cell += " (initial list)"
		}
		switch {
		case c.Note == "":
		case c.Verdict == Faithful:
			cell += " " + c.Note
		default:
			cell += " << " + c.Note
		}
		out[i] = strings.TrimRight(cell, " ")
	}
	return out
}

// pairRows lines the two sides up: calls that report the same write share a row; calls with a
// bad verdict get a row of their own, where they happened; after the delete that went back, a
// row says what each side's watch did next.
func pairRows(l, r []Call, lc, rc []string) [][2]string {
	good := func(c Call) bool { return (c.Verdict == Faithful || c.Verdict == WentBack) && c.Truth >= 0 }
	var rows [][2]string
	i, j := 0, 0
	for i < len(l) || j < len(r) {
		var row [2]string
		switch {
		case i < len(l) && !good(l[i]):
			row[0] = lc[i]
			i++
		case j < len(r) && !good(r[j]):
			row[1] = rc[j]
			j++
		case i < len(l) && j < len(r) && l[i].Truth == r[j].Truth:
			row = [2]string{lc[i], rc[j]}
			i, j = i+1, j+1
		case j >= len(r) || (i < len(l) && l[i].Truth < r[j].Truth):
			row[0] = lc[i]
			i++
		default:
			row[1] = rc[j]
			j++
		}
		rows = append(rows, row)
		if row[0] != "" && l[i-1].Verdict == WentBack {
			rows = append(rows,
				[2]string{"  ~ the watch ends; the reflector re-watches", "  ~ the upstream watch ends; watchsan resumes it"},
				[2]string{"    from that rv and gets replayed:", "    and the client's stream goes on"})
		}
	}
	return rows
}

package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
)

// The scenario's timeline of a phase: where its convergence time went. From the first scale's
// answer: the faults (marks), the Deployment's pipeline as the apiservers received it (the
// controller manager's ReplicaSet writes and pod creates, the scheduler's bindings, the
// kubelets' pod status writes: their audit logs), and, through watchsan, its health
// transitions and every request it answered with 5xx or after more than half a second (its
// access log). Logged for every phase, so that a phase that took too long says why.

// timelineEntry is one line of a timeline.
type timelineEntry struct {
	at   time.Time
	what string
}

// mark records a moment of the current phase (a fault) for its timeline.
func (e *scenarioEnv) mark(what string) {
	if ph := e.cur; ph != nil {
		ph.marks = append(ph.marks, timelineEntry{time.Now(), what})
	}
}

// timeline returns ph's timeline as text, every time relative to its first scale's answer.
func (e *scenarioEnv) timeline(ph *scenarioPhase, events []auditv1.Event) string {
	if len(ph.scaledAt) == 0 {
		return ""
	}
	zero := ph.scaledAt[0]
	var es []timelineEntry
	es = append(es, ph.marks...)
	for i, at := range ph.scaledAt {
		es = append(es, timelineEntry{at, fmt.Sprintf("scale %d answered", i+1)})
	}
	for _, ev := range events {
		at := ev.RequestReceivedTimestamp.Time
		if at.Before(ph.start) || !at.Before(ph.end) || ev.ObjectRef == nil || ev.ObjectRef.Namespace != scenarioNamespace {
			continue
		}
		client := auditClient(ev)
		r := ev.ObjectRef.Resource
		if ev.ObjectRef.Subresource != "" {
			r += "/" + ev.ObjectRef.Subresource
		}
		switch {
		case client == clientKCM && r == "replicasets" && (ev.Verb == "update" || ev.Verb == "patch"),
			client == clientKCM && r == "pods" && ev.Verb == "create",
			client == clientScheduler && r == "pods/binding",
			client == clientKubelets && r == "pods/status":
		default:
			continue
		}
		name := ev.ObjectRef.Name
		es = append(es, timelineEntry{at, fmt.Sprintf("%s %s %s %s (apiserver audit)", client, ev.Verb, r, name)})
	}
	if e.p != nil {
		for _, line := range strings.Split(e.p.Log(), "\n") {
			var m struct {
				TS                                       string
				Msg, Upstream, Verb, Resource, UserAgent string
				Code, RequestsCut, Watches               int
				Duration, SilentFor, Error               string // durations as Go prints them
			}
			if json.Unmarshal([]byte(line), &m) != nil {
				continue
			}
			at, err := time.Parse("2006-01-02T15:04:05.000Z0700", m.TS)
			if err != nil || at.Before(ph.start) || !at.Before(ph.end) {
				continue
			}
			switch {
			case strings.HasPrefix(m.Msg, "upstream unhealthy"):
				es = append(es, timelineEntry{at, fmt.Sprintf("watchsan: %s unhealthy (silent for %s, %d requests cut, %d watches): %s",
					m.Upstream, m.SilentFor, m.RequestsCut, m.Watches, m.Error)})
			case strings.HasPrefix(m.Msg, "upstream healthy"), strings.HasPrefix(m.Msg, "upstream degraded"), strings.HasPrefix(m.Msg, "upstream lagging"):
				es = append(es, timelineEntry{at, fmt.Sprintf("watchsan: %s %s", m.Upstream, strings.SplitN(m.Msg, ":", 2)[0])})
			case m.Msg == "request" && m.Verb != "watch":
				d, _ := time.ParseDuration(m.Duration)
				if m.Code < 500 && d < 500*time.Millisecond {
					continue
				}
				es = append(es, timelineEntry{at.Add(-d), fmt.Sprintf("watchsan: %s %s (%s) answered %d after %.2fs",
					m.Verb, m.Resource, shortUA(m.UserAgent), m.Code, d.Seconds())})
			}
		}
	}
	slices.SortStableFunc(es, func(a, b timelineEntry) int { return a.at.Compare(b.at) })
	var b strings.Builder
	fmt.Fprintf(&b, "scenario %s: %s timeline (from the first scale's answer; converged %s):\n", e.mode, ph.name, fmtConverge(ph.converge))
	for _, x := range es {
		if x.at.Sub(zero) > max(ph.converge, 0)+2*time.Second {
			continue // recovery, not convergence
		}
		fmt.Fprintf(&b, "  %+7.3fs %s\n", x.at.Sub(zero).Seconds(), x.what)
	}
	return b.String()
}

// shortUA is a user agent without its version and platform.
func shortUA(ua string) string {
	name, _, _ := strings.Cut(ua, "/")
	if i := strings.LastIndex(ua, "/"); i >= 0 && strings.Count(ua, "/") > 3 {
		return name + "/" + ua[i+1:]
	}
	return name
}

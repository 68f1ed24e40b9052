package check

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// Report is what a check found. Its JSON form (WriteJSON) is stable: fields are only ever
// added. Durations are seconds, rounded to a tenth.
type Report struct {
	// Server is the URL the check talked to (the kubeconfig's server or --server).
	Server string `json:"server"`
	// Namespace is the temporary namespace the check worked in.
	Namespace string `json:"namespace"`
	// Version is the apiserver's version against the affected releases.
	Version VersionResult `json:"version"`
	// Delete is the reproduction: create a, create others, delete a, while watching.
	Delete DeleteResult `json:"delete"`
	// Bookmarks is what a quiet watch that asked for bookmarks received.
	Bookmarks BookmarkResult `json:"bookmarks"`
	// IdleCut is whether the path ended an idle watch.
	IdleCut IdleResult `json:"idleCut"`
	// Problems lists, in plain words, every problem found; empty when none.
	Problems []string `json:"problems"`
	// Affected is true when Problems is not empty (exit code 1).
	Affected bool `json:"affected"`
	// Cleanup is how deleting the namespace went.
	Cleanup CleanupResult `json:"cleanup"`
}

// VersionResult compares the apiserver's /version with the affected releases.
type VersionResult struct {
	// GitVersion is /version's gitVersion, as the server sent it.
	GitVersion string `json:"gitVersion"`
	// Known is false when GitVersion does not read as MAJOR.MINOR.PATCH.
	Known bool `json:"known"`
	// Affected is true inside 1.7.0-1.7.12, 1.8.0-1.8.7 or 1.9.0-1.9.2.
	Affected bool `json:"affected"`
	// Detail says which range, or why not.
	Detail string `json:"detail"`
}

// Event is one watch event as it was on the wire.
type Event struct {
	// Type is ADDED, MODIFIED, DELETED or ERROR.
	Type string `json:"type"`
	// Name is the configmap's name; empty for an ERROR.
	Name string `json:"name,omitempty"`
	// RV is metadata.resourceVersion exactly as sent.
	RV string `json:"rv"`
}

func (e Event) String() string {
	if e.Name == "" {
		return e.Type + "@" + e.RV
	}
	return e.Type + " " + e.Name + "@" + e.RV
}

// DeleteResult is the reproduction of kubernetes#58545.
type DeleteResult struct {
	// Events are the events the watch delivered up to and including the DELETED one, in
	// order (bookmarks left out).
	Events []Event `json:"events"`
	// DeletedRV is the resourceVersion the DELETED event carried, PreviousRV the one of the
	// event before it.
	DeletedRV  string `json:"deletedRV"`
	PreviousRV string `json:"previousRV"`
	// WentBackwards is true when DeletedRV is not above PreviousRV.
	WentBackwards bool `json:"wentBackwards"`
	// OutOfOrder lists every event (DELETED or not) whose resourceVersion was not above
	// all those before it.
	OutOfOrder []Event `json:"outOfOrder"`
	// Replayed lists the events a new watch from DeletedRV delivered although the first watch
	// had delivered them already (what a client's next re-watch gets).
	Replayed []Event `json:"replayed"`
	// RewatchError is the error the re-watch from DeletedRV got, if any (a 410 makes a
	// client relist everything).
	RewatchError string `json:"rewatchError,omitempty"`
}

// BookmarkResult is what a quiet watch with allowWatchBookmarks=true and timeoutSeconds of
// the wait received. An apiserver sends such a watch a bookmark about every 60 s and one 2 s
// before its deadline, so at least one arrives within the wait unless the path drops them.
type BookmarkResult struct {
	// Checked is false when the check was skipped (--bookmark-wait=0).
	Checked bool `json:"checked"`
	// WaitSeconds is the wait (and the watch's timeoutSeconds).
	WaitSeconds float64 `json:"waitSeconds"`
	// AtSeconds are the times the bookmarks arrived, after the watch started.
	AtSeconds []float64 `json:"atSeconds"`
	// EndedEarlySeconds is when the watch ended before its deadline; 0 when it did not.
	EndedEarlySeconds float64 `json:"endedEarlySeconds,omitempty"`
}

// IdleResult is whether the path ended a watch that was kept idle (no bookmarks asked, no
// events) for the wait.
type IdleResult struct {
	// Checked is false when the check was skipped (--idle-wait=0).
	Checked bool `json:"checked"`
	// WaitSeconds is how long the watch was kept open at most.
	WaitSeconds float64 `json:"waitSeconds"`
	// Cut is true when the watch ended before the wait was over.
	Cut bool `json:"cut"`
	// CutAfterSeconds is when it ended, after it started.
	CutAfterSeconds float64 `json:"cutAfterSeconds,omitempty"`
	// How is how it ended: "clean end", an ERROR event or a read error.
	How string `json:"how,omitempty"`
}

// CleanupResult is how deleting the temporary namespace went.
type CleanupResult struct {
	// Deleted is true when the namespace was deleted (or is being, or was already gone).
	Deleted bool `json:"deleted"`
	// Error says why not.
	Error string `json:"error,omitempty"`
}

func seconds(d time.Duration) float64 { return math.Round(d.Seconds()*10) / 10 }

// WriteJSON writes r as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes r in plain words.
func (r *Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "watchsan check of %s (namespace %s)\n\n", r.Server, r.Namespace)

	v := r.Version
	fmt.Fprintf(w, "Version:    %s, %s.\n", orUnknown(v.GitVersion), v.Detail)

	d := r.Delete
	switch {
	case d.DeletedRV == "":
		fmt.Fprintln(w, "Delete:     not checked.")
	case d.WentBackwards:
		fmt.Fprintf(w, "Delete:     BACKWARDS: the DELETED event carried resourceVersion %s, the event before it %s.\n", d.DeletedRV, d.PreviousRV)
	default:
		fmt.Fprintf(w, "Delete:     ok: the DELETED event carried resourceVersion %s, after the %s of the event before it.\n", d.DeletedRV, d.PreviousRV)
	}
	if len(d.Events) > 0 {
		fmt.Fprintf(w, "            watched: %s\n", joinEvents(d.Events))
	}
	switch {
	case d.DeletedRV == "":
	case d.RewatchError != "":
		fmt.Fprintf(w, "Re-watch:   from %s: %s\n", d.DeletedRV, d.RewatchError)
	case len(d.Replayed) > 0:
		fmt.Fprintf(w, "Re-watch:   REPLAY: a watch from %s delivered %d events again: %s\n", d.DeletedRV, len(d.Replayed), joinEvents(d.Replayed))
	default:
		fmt.Fprintf(w, "Re-watch:   ok: a watch from %s delivered nothing already seen.\n", d.DeletedRV)
	}

	b := r.Bookmarks
	switch {
	case !b.Checked:
		fmt.Fprintln(w, "Bookmarks:  not checked (--bookmark-wait=0).")
	case len(b.AtSeconds) > 0:
		fmt.Fprintf(w, "Bookmarks:  ok: %d within %gs, at %s after the watch started%s.\n",
			len(b.AtSeconds), b.WaitSeconds, joinSeconds(b.AtSeconds), bookmarkNote(b))
	case b.EndedEarlySeconds > 0:
		fmt.Fprintf(w, "Bookmarks:  none: the watch was ended after %gs, before the apiserver's first bookmark was due.\n", b.EndedEarlySeconds)
	default:
		fmt.Fprintf(w, "Bookmarks:  NONE within %gs, although the apiserver sends one 2s before the watch's deadline: the path drops them.\n", b.WaitSeconds)
	}

	c := r.IdleCut
	switch {
	case !c.Checked:
		fmt.Fprintln(w, "Idle watch: not checked (--idle-wait=0).")
	case c.Cut:
		fmt.Fprintf(w, "Idle watch: CUT after %gs (%s).\n", c.CutAfterSeconds, c.How)
	default:
		fmt.Fprintf(w, "Idle watch: ok: not cut within %gs (a gateway's idle timeout may be longer, Envoy's default is 5m: raise --idle-wait to test it).\n", c.WaitSeconds)
	}

	fmt.Fprintln(w)
	if len(r.Problems) == 0 {
		fmt.Fprintln(w, "Result: no problem found.")
	} else {
		fmt.Fprintf(w, "Result: AFFECTED, %d problem(s):\n", len(r.Problems))
		for _, p := range r.Problems {
			fmt.Fprintf(w, "  - %s\n", p)
		}
	}
	if r.Cleanup.Deleted {
		fmt.Fprintf(w, "Cleanup: namespace %s deleted.\n", r.Namespace)
	} else if r.Namespace != "" {
		fmt.Fprintf(w, "Cleanup: could not delete namespace %s: %s\n", r.Namespace, r.Cleanup.Error)
	}
}

// bookmarkNote says which kind of bookmark came first: a periodic one, or only the one near the
// watch's deadline.
func bookmarkNote(b BookmarkResult) string {
	for _, at := range b.AtSeconds {
		if at < b.WaitSeconds-preDeadlineSlack.Seconds() {
			return fmt.Sprintf(" (the first periodic one after %gs; an apiserver sends one about every 60s, and one 2s before a watch's deadline)", at)
		}
	}
	return " (near the watch's deadline, when the apiserver sends one; its periodic one comes about every 60s: --bookmark-wait=70s to see it)"
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func joinEvents(evs []Event) string {
	s := make([]string, len(evs))
	for i, e := range evs {
		s[i] = e.String()
	}
	return strings.Join(s, ", ")
}

func joinSeconds(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf("%gs", x)
	}
	return strings.Join(s, ", ")
}

package watch

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/watchsan/watchsan/internal/upstream"
)

// notes records what Deps.Note is told.
type notes struct {
	mu  sync.Mutex
	got []string
}

func (n *notes) note(kind string, b *upstream.Backend, path, _ string) {
	name := "-"
	if b != nil {
		name = "backend"
	}
	n.mu.Lock()
	n.got = append(n.got, kind+" "+name+" "+path)
	n.mu.Unlock()
}

func (n *notes) String() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return strings.Join(n.got, "; ")
}

// TestNoteTellsAbsorbsAndRelists: Deps.Note (the status page's recent events) hears an
// absorbed 410 and a 410 passed to the client (a forced relist), with the backend and the
// client's path, once each.
func TestNoteTellsAbsorbsAndRelists(t *testing.T) {
	const path = "/api/v1/namespaces/d/configmaps" // the fixture's
	g := gapWatches(events(gone410))
	f := newFixture(t, Config{}, &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){g.step}})
	var absorbed notes
	f.h.deps.Note = absorbed.note
	f.watchUntil(t, "resourceVersion=0&allowWatchBookmarks=true", 13)
	if got, want := absorbed.String(), "absorb backend "+path; got != want {
		t.Errorf("absorbed: told [%s], want [%s]", got, want)
	}

	g = &gapUpstream{watches: []func(w http.ResponseWriter, r *http.Request){
		events(cmU("MODIFIED", "a", "ua", "14")), events(gone410)}, listRV: "21"}
	f = newFixture(t, Config{}, &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){g.step}})
	var relisted notes
	f.h.deps.Note = relisted.note
	f.watchUntil(t, "resourceVersion=5", 10)
	if got, want := relisted.String(), "relist backend "+path; got != want {
		t.Errorf("relisted: told [%s], want [%s]", got, want)
	}
}

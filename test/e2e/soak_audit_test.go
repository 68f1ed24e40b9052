package e2e

import (
	"testing"
	"time"
)

// The soak's audit on made-up histories: it must tell a lost, repeated or regressing event
// from what a relist legitimately does (resyncs, tombstones, skipped superseded changes).
func TestSoakAudit(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	ch := func(typ, name, rv, seq string, s float64) cmChange {
		return cmChange{Type: typ, Name: name, RV: rv, Seq: seq, At: at(s)}
	}
	want := map[string][]cmChange{
		"a": {ch("ADDED", "a", "10", "1", 1), ch("MODIFIED", "a", "12", "3", 2), ch("DELETED", "a", "", "3", 3)},
		"b": {ch("ADDED", "b", "11", "2", 1.5), ch("MODIFIED", "b", "13", "4", 2.5)},
	}
	exact := []cmChange{
		ch("ADDED", "a", "10", "1", 1.1), ch("ADDED", "b", "11", "2", 1.6), ch("MODIFIED", "a", "12", "3", 2.1),
		ch("MODIFIED", "b", "13", "4", 2.6), ch("DELETED", "a", "14", "3", 3.1),
	}
	resync := ch("MODIFIED", "b", "13", "4", 3.2)
	resync.Resync = true
	tomb := ch("DELETED", "a", "12", "3", 3.3)
	tomb.Tombstone = true
	early := ch("DELETED", "a", "12", "3", 2.95) // a tombstone before the writer recorded the delete (3)
	early.Tombstone = true
	stale := ch("DELETED", "a", "10", "1", 1.5) // a tombstone from before the deleted state was written
	stale.Tombstone = true

	for _, tc := range []struct {
		name    string
		got     []cmChange
		relists []time.Time
		check   func(a soakAudit) bool
	}{
		{"exact", exact, nil, func(a soakAudit) bool { return !a.failed() && a.seen == 5 && a.written == 5 }},
		{"resync is not a duplicate", append(clone(exact), resync), []time.Time{at(3.15)},
			func(a soakAudit) bool { return !a.failed() && a.resyncs == 1 }},
		{"lost", []cmChange{exact[0], exact[1], exact[3], exact[4]}, nil,
			func(a soakAudit) bool { return a.failed() && a.lost == 1 && a.excused == 0 }},
		{"duplicate", append(clone(exact[:4]), exact[3], exact[4]), nil,
			func(a soakAudit) bool { return a.failed() && a.dups == 1 }},
		{"a replay regresses", append(clone(exact), ch("MODIFIED", "b", "11", "2", 3.2)), nil,
			func(a soakAudit) bool { return a.failed() && a.dups == 1 && a.regress == 1 }},
		{"reordered across objects", []cmChange{exact[1], exact[0], exact[2], exact[3], exact[4]}, nil,
			func(a soakAudit) bool { return a.failed() && a.reorder == 1 && a.regress == 0 }},
		{"relist skips a superseded change and infers the delete", []cmChange{exact[0], exact[1], exact[3], tomb}, []time.Time{at(2.9)},
			func(a soakAudit) bool {
				return !a.failed() && a.lost == 2 && a.excused == 2 && a.tombstones == 1
			}},
		{"a tombstone the informer got before the writer recorded its delete", []cmChange{exact[0], exact[1], exact[2], exact[3], early}, []time.Time{at(2.9)},
			func(a soakAudit) bool { return !a.failed() && a.lost == 1 && a.excused == 1 }},
		{"a tombstone for an earlier life of the object does not excuse its delete", []cmChange{exact[0], exact[1], exact[2], exact[3], stale}, nil,
			func(a soakAudit) bool { return a.failed() && a.lost == 1 && a.excused == 0 }},
		{"a life around a relist that the informer never saw", []cmChange{exact[1], exact[3]}, []time.Time{at(3.2)},
			func(a soakAudit) bool { return !a.failed() && a.lost == 3 && a.excused == 3 }},
		{"a delete of a state the informer saw needs a delete or a tombstone", exact[:4], []time.Time{at(3.2)},
			func(a soakAudit) bool { return a.failed() && a.lost == 1 && a.excused == 0 }},
		{"a relist long after does not excuse a loss", []cmChange{exact[0], exact[1], exact[3], exact[4]}, []time.Time{at(600)},
			func(a soakAudit) bool { return a.failed() && a.lost == 1 && a.excused == 0 }},
		{"an absorbed delete at the stream's last resourceVersion", append(clone(exact[:4]), ch("DELETED", "a", "13", "3", 3.1)), nil,
			func(a soakAudit) bool { return !a.failed() && a.seen == 5 }},
		{"a delete below the stream's last resourceVersion goes back", append(clone(exact[:4]), ch("DELETED", "a", "12", "3", 3.1)), nil,
			func(a soakAudit) bool { return a.failed() && a.reorder == 1 && a.regress == 0 }},
		{"a delete below its object's last resourceVersion goes back", append(clone(exact[:4]), ch("DELETED", "a", "11", "3", 3.1)), nil,
			func(a soakAudit) bool { return a.failed() && a.reorder == 1 && a.regress == 1 }},
		{"an event nobody wrote", append(clone(exact), ch("ADDED", "c", "20", "9", 4)), nil,
			func(a soakAudit) bool { return a.failed() && a.unknown == 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if a := auditHistory(want, tc.got, tc.relists); !tc.check(a) {
				t.Errorf("audit %+v", a)
			}
		})
	}
}

func clone(c []cmChange) []cmChange { return append([]cmChange(nil), c...) }

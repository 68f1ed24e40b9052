package fix

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/watchsan/watchsan/internal/stream"
)

// BenchmarkDecidePass: the path almost every event takes, an in-order MODIFIED.
func BenchmarkDecidePass(b *testing.B) {
	s := NewStream(Options{StartRV: "1"})
	e := ev(stream.Modified, "2", "0b6a3c5e-1c2d-4e5f-8a9b-0123456789ab", "default", "svc")
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		e.RVInt = uint64(i) + 2
		if s.Decide(e).Action != Pass {
			b.Fatal("not passed")
		}
	}
}

// BenchmarkDecideInitial: an ADDED of the initial phase.
func BenchmarkDecideInitial(b *testing.B) {
	s := NewStream(Options{StartRV: "0"})
	e := ev(stream.Added, "2", "0b6a3c5e-1c2d-4e5f-8a9b-0123456789ab", "default", "svc")
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		e.RVInt = uint64(i % 1000)
		s.Decide(e)
	}
}

// BenchmarkDecideRewrite: a regressed DELETED of a new object each time, rewritten and
// remembered (the 1.7 bug on every delete).
func BenchmarkDecideRewrite(b *testing.B) {
	mem := NewDeleteMemory(1<<16, time.Hour, nil)
	s := NewStream(Options{Scope: "/api/v1/services", StartRV: "100", Memory: mem})
	uids := make([]string, 4096)
	for i := range uids {
		uids[i] = "0b6a3c5e-1c2d-4e5f-8a9b-" + strconv.Itoa(100000000000+i)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%len(uids) == 0 { // a new stream: its delete set starts empty again
			s = NewStream(Options{Scope: "/api/v1/services", StartRV: "100", Memory: mem})
		}
		e := ev(stream.Deleted, "50", uids[i%len(uids)], "default", "svc")
		if s.Decide(e).Action != Rewrite {
			b.Fatal("not rewritten")
		}
	}
}

// BenchmarkMemoryBytesPerDelete reports the heap held per remembered delete (UID text
// included), as B/delete.
func BenchmarkMemoryBytesPerDelete(b *testing.B) {
	const n = 100000
	keys := make([]objKey, n)
	for i := range keys {
		keys[i] = objKey{uid: "0b6a3c5e-1c2d-4e5f-8a9b-" + strconv.Itoa(100000000000+i)}
	}
	var perDelete float64
	for b.Loop() {
		m := NewDeleteMemory(n, time.Hour, nil)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := range keys {
			k := keys[i].clone() // what Stream stores
			m.record("/api/v1/services|user=x", uint64(1000+i), k, 50, uint64(999+i))
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		perDelete = float64(after.HeapAlloc-before.HeapAlloc) / n
		runtime.KeepAlive(m)
	}
	b.ReportMetric(perDelete, "B/delete")
}

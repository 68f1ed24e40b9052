package watch

import (
	"net/http"
	"testing"

	"github.com/watchsan/watchsan/internal/stream"
)

// What follows an attempt is one table: every way an attempt (or the try to go on after it)
// ends maps to one step, with its rule's stable label.
func TestDecideNextTable(t *testing.T) {
	broke := ending{how: howBroke, resumable: true}
	with := func(e ending, f func(*ending)) ending { f(&e); return e }
	for _, tc := range []struct {
		name string
		in   ending
		want verdict
	}{
		{"the client left", ending{how: howEnded, end: EndClientGone}, verdict{stepEnd, EndClientGone, ruleEnded}},
		{"shutdown, with a move accepted", ending{how: howEnded, end: EndShutdown, moved: true, resumable: true}, verdict{stepEnd, EndShutdown, ruleEnded}},
		{"broke, resumable", broke, verdict{stepResume, endNone, ruleResume}},
		{"broke, a move accepted", with(broke, func(e *ending) { e.moved = true }), verdict{stepSwitch, endNone, ruleSwitch}},
		{"broke, not resumable", with(broke, func(e *ending) { e.resumable, e.moved = false, true }), verdict{stepEnd, EndNoResume, ruleNoResume}},
		{"broke, not resumable and past the deadline", with(broke, func(e *ending) { e.resumable, e.overDeadline = false, true }), verdict{stepEnd, EndNoResume, ruleNoResume}},
		{"broke past the client's deadline", with(broke, func(e *ending) { e.overDeadline, e.moved = true, true }), verdict{stepEnd, EndDeadline, ruleDeadline}},
		{"broke past the max lifetime", with(broke, func(e *ending) { e.overDeadline, e.maxLifetime = true, true }), verdict{stepEnd, EndMaxLifetime, ruleDeadline}},
		{"resumed", ending{how: howResumed}, verdict{stepGoOn, endNone, ruleResumed}},
		{"a resume answered 410", ending{how: howResumeGone}, verdict{stepAbsorb, endNone, ruleAbsorb}},
		{"absorbed", ending{how: howAbsorbed}, verdict{stepResume, endNone, ruleAbsorbed}},
		{"not absorbed", ending{how: howNotAbsorbed}, verdict{stepRelist, EndRelist, ruleNotAbsorbed}},
		{"no resume in time", ending{how: howResumeFailed}, verdict{stepEnd, EndResumeTimeout, ruleResumeTimedOut}},
		{"a resume refused", ending{how: howResumeRefused}, verdict{stepEnd, EndResumeRefused, ruleResumeRefused}},
	} {
		if got := decideNext(tc.in); got != tc.want {
			t.Errorf("%s: decideNext(%+v) = %+v, want %+v", tc.name, tc.in, got, tc.want)
		}
	}
	// Every rule is one of nextRules, each label once.
	seen := map[string]bool{}
	for _, r := range nextRules {
		if seen[r] {
			t.Errorf("rule %q listed twice", r)
		}
		seen[r] = true
	}
	for how := howEnded; how <= howNotAbsorbed; how++ {
		for _, e := range []ending{{how: how}, {how: how, resumable: true}, {how: how, resumable: true, moved: true}} {
			if r := decideNext(e).rule; !seen[r] {
				t.Errorf("decideNext(%+v): rule %q is not in nextRules", e, r)
			}
		}
	}
}

// readable is the one test of "a stream we can read", and readsAs adds the feed's format.
func TestReadable(t *testing.T) {
	resp := func(code int, ct, ce string) *http.Response {
		h := http.Header{"Content-Type": {ct}}
		if ce != "" {
			h.Set("Content-Encoding", ce)
		}
		return &http.Response{StatusCode: code, Header: h}
	}
	f := &feed{format: stream.JSON}
	for _, tc := range []struct {
		name             string
		resp             *http.Response
		readable, readAs bool
	}{
		{"json", resp(200, "application/json", ""), true, true},
		{"json, identity", resp(200, "application/json", "identity"), true, true},
		{"gzip", resp(200, "application/json", "gzip"), false, false},
		{"an error status", resp(500, "application/json", ""), false, false},
		{"a 410", resp(http.StatusGone, "application/json", ""), false, false},
		{"a format not read", resp(200, "text/plain", ""), false, false},
		{"another format", resp(200, "application/vnd.kubernetes.protobuf;stream=watch", ""), true, false},
	} {
		if _, ok := readable(tc.resp); ok != tc.readable {
			t.Errorf("%s: readable = %v, want %v", tc.name, ok, tc.readable)
		}
		if ok := f.readsAs(tc.resp); ok != tc.readAs {
			t.Errorf("%s: readsAs = %v, want %v", tc.name, ok, tc.readAs)
		}
	}
}

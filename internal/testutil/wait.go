// Package testutil holds the helpers every test package shares: waiting on a condition with a
// deadline (never sleep-and-hope).
package testutil

import (
	"testing"
	"time"
)

// Poll is how often Eventually and Until look at their condition.
const Poll = 10 * time.Millisecond

// Eventually waits until cond holds, failing the test when timeout passes first.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Until(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Until waits until cond holds or timeout passes, and reports whether cond held; for
// goroutines that may not fail the test themselves.
func Until(timeout time.Duration, cond func() bool) bool {
	return UntilEvery(timeout, Poll, cond)
}

// UntilEvery is Until looking every interval: for a condition that costs a request to a real
// server each time.
func UntilEvery(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
	return true
}

package faults

import (
	"strings"
	"testing"
	"time"
)

func TestParseFaultsRoundTrip(t *testing.T) {
	for _, f := range []Faults{
		{},
		{DeleteOldRV: true, EndWatchAfterDelete: true},
		{ResetEveryN: 5, ResetTCP: true, Fail503FirstK: 2, StallAfterN: 7, GoAway: true},
		{EndImmediately: true},
		{EndIdleAfter: 90 * time.Second, DropBookmarks: true},
	} {
		got, err := ParseFaults(f.String())
		if err != nil || got != f {
			t.Errorf("ParseFaults(%q) = %+v, %v; want %+v", f.String(), got, err, f)
		}
	}
	if got, err := ParseFaults(" delete-old-rv , stall-after=3 "); err != nil || got != (Faults{DeleteOldRV: true, StallAfterN: 3}) {
		t.Errorf("with spaces: %+v, %v", got, err)
	}
}

func TestParseFaultsErrors(t *testing.T) {
	_, err := ParseFaults("delete-old-rv=1,reset-every=x,stall-after,fail-503-first=-2,bogus,end-idle-after=0s")
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"delete-old-rv takes no value", `reset-every needs a positive count`,
		"stall-after needs", "fail-503-first needs", `unknown fault "bogus"`,
		"end-idle-after needs a positive duration"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if _, err := ParseFaults("reset-tcp"); err == nil || !strings.Contains(err.Error(), "ResetTCP needs ResetEveryN") {
		t.Errorf("reset-tcp alone: %v", err)
	}
}

package faults

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ParseFaults reads faults written as String writes them, for flags and config files: a
// comma-separated list of delete-old-rv, end-after-delete, reset-every=N, reset-tcp,
// fail-503-first=K, stall-after=N, goaway, end-immediately, end-idle-after=DURATION and
// drop-bookmarks. "" and "none" are no faults. Every problem is
// reported at once.
func ParseFaults(s string) (Faults, error) {
	var f Faults
	s = strings.TrimSpace(s)
	if s == "" || s == "none" {
		return f, nil
	}
	var errs []error
	for _, item := range strings.Split(s, ",") {
		name, val, hasVal := strings.Cut(strings.TrimSpace(item), "=")
		count := func(dst *int) {
			n, err := strconv.Atoi(val)
			if !hasVal || err != nil || n <= 0 {
				errs = append(errs, fmt.Errorf("faults: %s needs a positive count (%s=N), got %q", name, name, item))
				return
			}
			*dst = n
		}
		flag := func(dst *bool) {
			if hasVal {
				errs = append(errs, fmt.Errorf("faults: %s takes no value, got %q", name, item))
				return
			}
			*dst = true
		}
		switch name {
		case "delete-old-rv":
			flag(&f.DeleteOldRV)
		case "end-after-delete":
			flag(&f.EndWatchAfterDelete)
		case "reset-every":
			count(&f.ResetEveryN)
		case "reset-tcp":
			flag(&f.ResetTCP)
		case "fail-503-first":
			count(&f.Fail503FirstK)
		case "stall-after":
			count(&f.StallAfterN)
		case "goaway":
			flag(&f.GoAway)
		case "end-immediately":
			flag(&f.EndImmediately)
		case "end-idle-after":
			d, err := time.ParseDuration(val)
			if !hasVal || err != nil || d <= 0 {
				errs = append(errs, fmt.Errorf("faults: %s needs a positive duration (%s=30s), got %q", name, name, item))
				continue
			}
			f.EndIdleAfter = d
		case "drop-bookmarks":
			flag(&f.DropBookmarks)
		default:
			errs = append(errs, fmt.Errorf("faults: unknown fault %q (known: delete-old-rv, end-after-delete, "+
				"reset-every=N, reset-tcp, fail-503-first=K, stall-after=N, goaway, end-immediately, "+
				"end-idle-after=DURATION, drop-bookmarks)", name))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Faults{}, err
	}
	return f, f.Validate()
}

// String writes f as ParseFaults reads it; "none" for no faults.
func (f Faults) String() string {
	var parts []string
	if f.DeleteOldRV {
		parts = append(parts, "delete-old-rv")
	}
	if f.EndWatchAfterDelete {
		parts = append(parts, "end-after-delete")
	}
	if f.ResetEveryN != 0 {
		parts = append(parts, "reset-every="+strconv.Itoa(f.ResetEveryN))
	}
	if f.ResetTCP {
		parts = append(parts, "reset-tcp")
	}
	if f.Fail503FirstK != 0 {
		parts = append(parts, "fail-503-first="+strconv.Itoa(f.Fail503FirstK))
	}
	if f.StallAfterN != 0 {
		parts = append(parts, "stall-after="+strconv.Itoa(f.StallAfterN))
	}
	if f.GoAway {
		parts = append(parts, "goaway")
	}
	if f.EndImmediately {
		parts = append(parts, "end-immediately")
	}
	if f.EndIdleAfter != 0 {
		parts = append(parts, "end-idle-after="+f.EndIdleAfter.String())
	}
	if f.DropBookmarks {
		parts = append(parts, "drop-bookmarks")
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

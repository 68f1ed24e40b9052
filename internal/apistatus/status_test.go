package apistatus

import (
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/watchsan/watchsan/internal/upstream"
)

// The Retry-After each failure to hear from an upstream carries: 1 when no upstream is
// usable (the client waits a second for one), 0 for a request cut on a frozen upstream (the
// next attempt goes to another one: no reason to wait; docs/design.md section 10.8), none for
// a protocol error.
func TestRetryAfterOfUpstreamErrors(t *testing.T) {
	for _, tc := range []struct {
		err   error
		code  int
		retry string
	}{
		{fmt.Errorf("%w (a unhealthy)", upstream.ErrNoBackend), 503, "1"},
		{fmt.Errorf("%w (last: %w)", upstream.ErrNoBackend, upstream.ErrFrozen), 503, "1"},
		{fmt.Errorf("%w: context canceled", upstream.ErrFrozen), 503, "0"},
		{errors.New("http2: frame too large"), 502, ""},
	} {
		w := httptest.NewRecorder()
		Write(w, ForUpstreamError("https://a", tc.err))
		_, has := w.Header()["Retry-After"]
		if w.Code != tc.code || w.Header().Get("Retry-After") != tc.retry || has != (tc.retry != "") {
			t.Errorf("%v: %d with Retry-After %q, want %d with %q", tc.err, w.Code, w.Header().Values("Retry-After"), tc.code, tc.retry)
		}
	}
}

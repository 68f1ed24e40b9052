// Package apistatus answers a client the way the apiserver would when watchsan itself must
// refuse or fail a request: a metav1.Status JSON body with a matching HTTP code and reason.
package apistatus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"syscall"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/upstream"
)

// New builds a Failure status.
func New(code int32, reason metav1.StatusReason, msg string) *metav1.Status {
	return &metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Message:  msg,
		Reason:   reason,
		Code:     code,
	}
}

// ForUpstreamError maps a failure to reach or hear from an upstream, before any response byte
// went to the client, to the status the client gets. It is the one place this mapping lives:
//   - no upstream is usable (upstream.ErrNoBackend): 503 ServiceUnavailable with Retry-After 1,
//     at once; client-go and kubectl retry such an answer on their own;
//   - the upstream refused or reset the connection, or is not reachable: 503 ServiceUnavailable
//     (the client's retry logic treats it as "try again");
//   - its upstream was declared unhealthy while it waited, and it was not safe to repeat
//     (upstream.ErrFrozen): 503 with Retry-After 0, saying it may have been processed: a
//     client that repeats it (client-go does) may do so at once, since watchsan sends nothing
//     to a backend found unhealthy and waiting would only add to the request's time
//     (docs/design.md section 10.8);
//   - a timeout (dial, TLS handshake, response headers): 504 Timeout;
//   - anything else (bad TLS, protocol garbage): 502 with reason InternalError.
func ForUpstreamError(name string, err error) *metav1.Status {
	var ne net.Error
	switch {
	case errors.Is(err, upstream.ErrNoBackend):
		st := New(http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
			"watchsan: "+err.Error())
		st.Details = &metav1.StatusDetails{RetryAfterSeconds: 1}
		return st
	case errors.Is(err, upstream.ErrFrozen):
		// docs/design.md section 10.8: it was not safe to repeat; the client decides.
		st := New(http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
			fmt.Sprintf("watchsan: upstream %s stopped answering while this request was in flight; it may have been processed (a create may have happened): check before you retry", name))
		st.Details = &metav1.StatusDetails{RetryAfterSeconds: 0} // Write sends Retry-After: 0
		return st
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return New(http.StatusGatewayTimeout, metav1.StatusReasonTimeout,
			fmt.Sprintf("watchsan: upstream %s did not answer in time: %v", name, err))
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH), upstream.IsDialError(err):
		return New(http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
			fmt.Sprintf("watchsan: upstream %s is unavailable: %v", name, err))
	default:
		return New(http.StatusBadGateway, metav1.StatusReasonInternalError,
			fmt.Sprintf("watchsan: error talking to upstream %s: %v", name, err))
	}
}

// ShuttingDown is the answer to a request watchsan will not serve because it is shutting down
// (a watch that arrives, or is opened again, after its --shutdown-delay): 429 TooManyRequests
// with Retry-After 1, to be sent with WriteClose. It is what the apiserver answers after its own
// shutdown delay (`WithRetryAfter` in k8s.io/apiserver/pkg/server/filters: 429, Retry-After,
// Connection: close), for the same reason: client-go's REST client repeats a 429 or 5xx that has
// a Retry-After (up to 10 times, rest.Request's maxRetries), on a new connection that a load
// balancer sends to another replica, and if it gives up its Reflector still treats a 429 as
// "back off and watch again from the last resourceVersion" (`isWatchErrorRetriable`), where a
// 503 without Retry-After ends the watch with an error and the Reflector relists
// (docs/design.md section 10.4). One second, not the apiserver's five: the closed connection,
// not the wait, is what sends the retry elsewhere.
func ShuttingDown() *metav1.Status {
	st := New(http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests,
		"watchsan is shutting down, please try again later")
	st.Details = &metav1.StatusDetails{RetryAfterSeconds: 1}
	return st
}

// WriteClose is Write with the connection closed after the response (Connection: close; Go's
// HTTP/2 server sends GOAWAY for it and closes the connection once idle), so that the client's
// next request opens a new connection.
func WriteClose(w http.ResponseWriter, st *metav1.Status) {
	w.Header().Set("Connection", "close")
	Write(w, st)
}

// Write sends st as the whole response. The caller must not have written anything yet. A
// status with Details carries Retry-After: Details.RetryAfterSeconds, 0 included (retry at
// once; the JSON omits a zero retryAfterSeconds, the header says it).
func Write(w http.ResponseWriter, st *metav1.Status) {
	body, err := json.Marshal(st)
	if err != nil { // a Status always marshals; keep the client informed regardless
		body = []byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","code":500}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	h.Set("X-Content-Type-Options", "nosniff")
	if st.Details != nil && st.Details.RetryAfterSeconds >= 0 {
		h.Set("Retry-After", strconv.Itoa(int(st.Details.RetryAfterSeconds)))
	}
	w.WriteHeader(int(st.Code))
	_, _ = w.Write(append(body, '\n'))
}

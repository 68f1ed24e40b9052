package faults

import (
	"encoding/json"
	"net/http"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fail503Fault answers the first Fail503FirstK watch requests as an apiserver that is shutting
// down answers a new watch (k8s.io/apiserver's WithWatchTerminationDuringShutdown): 503,
// Retry-After: 1, and a Status reason ServiceUnavailable.
var fail503Fault = fault{
	name: "fail-503",
	admit: func(a *active, wt *watchReq) bool {
		if a.Fail503FirstK <= 0 || a.admitted.Add(1) > int64(a.Fail503FirstK) {
			return false
		}
		wt.l.stats.refused503.Add(1)
		wt.log.Info("answering a watch with 503 (Fail503FirstK)")
		writeStatus(wt.w, &metav1.Status{
			TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status:   metav1.StatusFailure,
			Message:  "apiserver is shutting down",
			Reason:   metav1.StatusReasonServiceUnavailable,
			Code:     http.StatusServiceUnavailable,
		}, "1")
		return true
	},
}

// writeStatus answers with st as the apiserver does: JSON, the code in st.Code.
func writeStatus(w http.ResponseWriter, st *metav1.Status, retryAfter string) {
	body, err := json.Marshal(st)
	if err != nil { // a Status always marshals
		panic(err)
	}
	h := w.Header()
	if retryAfter != "" {
		h.Set("Retry-After", retryAfter)
	}
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(int(st.Code))
	_, _ = w.Write(append(body, '\n'))
}

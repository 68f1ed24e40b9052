package server

import (
	"fmt"
	"net/http"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/apistatus"
)

// refuseForeign keeps watchsan from being an open proxy: CONNECT and absolute-form request
// targets are refused before anything reaches an upstream (issue #2). Every absolute form is
// refused, not only those naming another host: Go takes Host from an absolute target, so the
// host cannot be told apart, and no Kubernetes client sends one to a server that is not a proxy.
func refuseForeign(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodConnect {
			apistatus.Write(w, apistatus.New(http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed,
				"watchsan: CONNECT is not supported; this is an apiserver proxy, not a forward proxy"))
			return
		}
		if r.URL.IsAbs() || r.URL.Host != "" {
			apistatus.Write(w, apistatus.New(http.StatusBadRequest, metav1.StatusReasonBadRequest,
				fmt.Sprintf("watchsan: absolute request target for host %q refused; this is an apiserver proxy, not a forward proxy", r.URL.Host)))
			return
		}
		next.ServeHTTP(w, r)
	})
}

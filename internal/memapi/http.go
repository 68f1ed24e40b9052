package memapi

import (
	"encoding/json"
	"net"
	"net/http"
	"runtime"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"
)

func (r *resource) gk() schema.GroupKind { return schema.GroupKind{Kind: r.Kind} }

func writeJSON(w http.ResponseWriter, code int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// statusJSON encodes a StatusError's metav1.Status, with its kind and version.
func statusJSON(serr *apierrors.StatusError) []byte {
	st := serr.ErrStatus
	st.Kind, st.APIVersion = "Status", "v1"
	b, err := json.Marshal(&st)
	if err != nil { // a Status always encodes
		panic(err)
	}
	return b
}

// writeStatus answers with a metav1.Status, as the apiserver answers every error.
func writeStatus(w http.ResponseWriter, serr *apierrors.StatusError) {
	if ra := serr.ErrStatus.Details; ra != nil && ra.RetryAfterSeconds > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(ra.RetryAfterSeconds)))
	}
	code := int(serr.ErrStatus.Code)
	if code == 0 {
		code = http.StatusInternalServerError
	}
	writeJSON(w, code, statusJSON(serr))
}

func writeStatusObject(w http.ResponseWriter, code int, st *metav1.Status) {
	st.Kind, st.APIVersion = "Status", "v1"
	b, err := json.Marshal(st)
	if err != nil {
		panic(err)
	}
	writeJSON(w, code, b)
}

func writeValue(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeStatus(w, apierrors.NewInternalError(err))
		return
	}
	writeJSON(w, http.StatusOK, b)
}

// errNotFoundPath is the apiserver's answer to a path it does not serve.
func errNotFoundPath() *apierrors.StatusError {
	return apierrors.NewGenericServerResponse(http.StatusNotFound, "", schema.GroupResource{}, "", "the server could not find the requested resource", 0, false)
}

func errNotAcceptable() *apierrors.StatusError {
	return apierrors.NewGenericServerResponse(http.StatusNotAcceptable, "", schema.GroupResource{}, "",
		"only the following media types are accepted: application/json", 0, false)
}

func errMethod(res *resource, method string) *apierrors.StatusError {
	return apierrors.NewMethodNotSupported(res.gr, method)
}

func (s *Server) serveVersion(w http.ResponseWriter) {
	writeValue(w, version.Info{
		Major:      "1",
		Minor:      "37",
		GitVersion: "v1.37.2-memapi",
		GoVersion:  runtime.Version(),
		Compiler:   runtime.Compiler,
		Platform:   runtime.GOOS + "/" + runtime.GOARCH,
	})
}

func (s *Server) serveAPIVersions(w http.ResponseWriter, r *http.Request) {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil && h == "" {
		host = "127.0.0.1" + host
	}
	writeValue(w, &metav1.APIVersions{
		TypeMeta:                   metav1.TypeMeta{Kind: "APIVersions"},
		Versions:                   []string{"v1"},
		ServerAddressByClientCIDRs: []metav1.ServerAddressByClientCIDR{{ClientCIDR: "0.0.0.0/0", ServerAddress: host}},
	})
}

func (s *Server) serveAPIGroups(w http.ResponseWriter) {
	writeValue(w, &metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}, Groups: []metav1.APIGroup{}})
}

func (s *Server) serveResourceList(w http.ResponseWriter) {
	list := &metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"}, GroupVersion: "v1"}
	for _, r := range s.order {
		list.APIResources = append(list.APIResources, metav1.APIResource{
			Name:         r.Name,
			Namespaced:   r.Namespaced,
			Kind:         r.Kind,
			Verbs:        metav1.Verbs{"create", "delete", "get", "list", "update", "watch"},
			SingularName: "",
		})
	}
	writeValue(w, list)
}

package faults

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	restclientwatch "k8s.io/client-go/rest/watch"
)

// The apiserver stand-in of these tests writes watch frames exactly as the apiserver's
// watchEncoder does (k8s.io/apiserver/pkg/endpoints/handlers/response.go): the object with
// the negotiated serializer, wrapped in a metav1.WatchEvent encoded with the stream
// serializer, through the stream framer. Clients read them back with client-go's watch
// decoder. Both are the reference, not the layer's own parser.

var codecs = serializer.NewCodecFactory(scheme.Scheme, serializer.WithSerializer(cbor.NewSerializerInfo))

type wireFormat struct {
	name        string
	accept      string // what a client asks for
	contentType string // what the apiserver answers a watch with
	info        runtime.SerializerInfo
}

func mustInfo(mediaType string) runtime.SerializerInfo {
	for _, info := range codecs.SupportedMediaTypes() {
		if info.MediaType == mediaType {
			return info
		}
	}
	panic("no serializer for " + mediaType)
}

var (
	jsonFormat  = wireFormat{"json", "application/json", "application/json", mustInfo("application/json")}
	protoFormat = wireFormat{"protobuf", "application/vnd.kubernetes.protobuf", "application/vnd.kubernetes.protobuf;stream=watch", mustInfo("application/vnd.kubernetes.protobuf")}
	cborFormat  = wireFormat{"cbor", "application/cbor", "application/cbor-seq", mustInfo("application/cbor")}
	allFormats  = []wireFormat{jsonFormat, protoFormat, cborFormat}
)

func formatForAccept(accept string) wireFormat {
	for _, f := range allFormats {
		if strings.HasPrefix(accept, f.accept) {
			return f
		}
	}
	return jsonFormat
}

// frame encodes one watch event as the apiserver puts it on the wire.
func (f wireFormat) frame(t testing.TB, typ watch.EventType, obj runtime.Object) []byte {
	t.Helper()
	obj = obj.DeepCopyObject() // encoding sets the kind on the object; scripts are shared
	gv := corev1.SchemeGroupVersion
	var embedded bytes.Buffer
	if err := codecs.EncoderForVersion(f.info.Serializer, gv).Encode(obj, &embedded); err != nil {
		t.Fatalf("encoding object: %v", err)
	}
	var event bytes.Buffer
	outer := codecs.EncoderForVersion(f.info.StreamSerializer.Serializer, gv)
	if err := outer.Encode(&metav1.WatchEvent{Type: string(typ), Object: runtime.RawExtension{Raw: embedded.Bytes()}}, &event); err != nil {
		t.Fatalf("encoding event: %v", err)
	}
	var out bytes.Buffer
	if _, err := f.info.StreamSerializer.Framer.NewFrameWriter(&out).Write(event.Bytes()); err != nil {
		t.Fatalf("framing: %v", err)
	}
	return out.Bytes()
}

// decoder reads watch events from body as client-go does.
func (f wireFormat) decoder(body io.ReadCloser) *restclientwatch.Decoder {
	frames := f.info.StreamSerializer.Framer.NewFrameReader(body)
	return restclientwatch.NewDecoder(streaming.NewDecoder(frames, f.info.StreamSerializer.Serializer), codecs.UniversalDeserializer())
}

func cm(name, uid, rv string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{Kind: "ConfigMap", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "ns", UID: types.UID(uid), ResourceVersion: rv,
			Labels: map[string]string{"app": "demo"},
		},
		Data: map[string]string{"key": "value of " + name},
	}
}

type evt struct {
	typ watch.EventType
	obj runtime.Object
}

// script is what the stand-in answers one watch with.
type script struct {
	events []evt
	// then runs after the events (garbage, an abort); nil does nothing.
	then func(w http.ResponseWriter, r *http.Request)
	// hold keeps the response open until the client goes away; otherwise it ends cleanly.
	hold bool
}

// standIn is a fake apiserver for the layer's mechanics: watches answered from scripts (keyed
// by the namespace in the path, "" for all namespaces), LISTs by a function.
type standIn struct {
	t       testing.TB
	scripts map[string]script
	// list answers non-watch requests; nil answers 404.
	list func(w http.ResponseWriter, r *http.Request)

	mu      sync.Mutex
	watches []*http.Request // clones of the watch requests received
	lists   []*http.Request
	// watchEnded receives once per watch handler that returned.
	watchEnded chan struct{}
}

func newStandIn(t testing.TB, scripts map[string]script) *standIn {
	return &standIn{t: t, scripts: scripts, watchEnded: make(chan struct{}, 100)}
}

func namespaceOf(path string) string {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	for i := 0; i+1 < len(segs); i++ {
		if segs[i] == "namespaces" {
			return segs[i+1]
		}
	}
	return ""
}

func (s *standIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Get("watch") != "true" && q.Get("watch") != "1" {
		s.mu.Lock()
		s.lists = append(s.lists, r.Clone(context.Background()))
		s.mu.Unlock()
		if s.list == nil {
			http.NotFound(w, r)
			return
		}
		s.list(w, r)
		return
	}
	s.mu.Lock()
	s.watches = append(s.watches, r.Clone(context.Background()))
	s.mu.Unlock()
	defer func() { s.watchEnded <- struct{}{} }()

	sc, ok := s.scripts[namespaceOf(r.URL.Path)]
	if !ok {
		http.Error(w, "no script", http.StatusNotFound)
		return
	}
	f := formatForAccept(r.Header.Get("Accept"))
	w.Header().Set("Content-Type", f.contentType)
	w.Header().Set("Cache-Control", "no-cache, private")
	w.WriteHeader(http.StatusOK)
	http.NewResponseController(w).Flush()
	for _, e := range sc.events {
		if _, err := w.Write(f.frame(s.t, e.typ, e.obj)); err != nil {
			return
		}
		if err := http.NewResponseController(w).Flush(); err != nil {
			return
		}
	}
	if sc.then != nil {
		sc.then(w, r)
	}
	if sc.hold {
		<-r.Context().Done()
	}
}

func (s *standIn) watchRequests() []*http.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*http.Request(nil), s.watches...)
}

func (s *standIn) listRequests() []*http.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*http.Request(nil), s.lists...)
}

// frames is what the stand-in writes for sc in format f.
func (sc script) frames(t testing.TB, f wireFormat) [][]byte {
	var out [][]byte
	for _, e := range sc.events {
		out = append(out, f.frame(t, e.typ, e.obj))
	}
	return out
}

// setup is a stand-in apiserver, a ReverseProxy to it (as tests and the demo put one in front
// of a real apiserver), the layer in front of that, and a server for the layer.
type setup struct {
	standIn *standIn
	layer   *Layer
	server  *httptest.Server
	// handlerDone receives once per request the layer's ServeHTTP returned from.
	handlerDone chan struct{}
}

type setupOption func(*httptest.Server, *Layer)

func newSetup(t *testing.T, s *standIn, opts ...setupOption) *setup {
	t.Helper()
	up := httptest.NewServer(s)
	t.Cleanup(up.Close)
	target, _ := url.Parse(up.URL)
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
	}
	layer := New(proxy, zaptest.NewLogger(t))
	st := &setup{standIn: s, layer: layer, handlerDone: make(chan struct{}, 100)}
	// The wrapper checks that the layer never modifies the request it was given.
	wrapped := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { st.handlerDone <- struct{}{} }()
		before := r.Header.Clone()
		uri := r.URL.String()
		defer func() {
			if !equalHeader(before, r.Header) || r.URL.String() != uri {
				t.Errorf("layer modified the incoming request: header %v -> %v, url %s -> %s", before, r.Header, uri, r.URL)
			}
		}()
		layer.ServeHTTP(w, r)
	})
	srv := httptest.NewUnstartedServer(wrapped)
	for _, o := range opts {
		o(srv, layer)
	}
	if srv.EnableHTTP2 {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	st.server = srv
	t.Cleanup(srv.Close)
	return st
}

func withHTTP2(srv *httptest.Server, _ *Layer) { srv.EnableHTTP2 = true }

func equalHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, va := range a {
		vb := b[k]
		if len(va) != len(vb) {
			return false
		}
		for i := range va {
			if va[i] != vb[i] {
				return false
			}
		}
	}
	return true
}

// openWatch starts a watch through the layer in format f on path (a list path; ?watch=1 is
// added) and fails the test unless it answers 200.
func (st *setup) openWatch(t *testing.T, ctx context.Context, path string, f wireFormat, hdr http.Header) *http.Response {
	t.Helper()
	resp := st.get(t, ctx, path+"?watch=1&allowWatchBookmarks=true", f, hdr)
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("watch %s: %s: %s", path, resp.Status, body)
	}
	return resp
}

func (st *setup) get(t *testing.T, ctx context.Context, pathAndQuery string, f wireFormat, hdr http.Header) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, st.server.URL+pathAndQuery, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	req.Header.Set("Accept", f.accept)
	resp, err := st.server.Client().Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", pathAndQuery, err)
	}
	return resp
}

// decoded is one event as client-go decoded it.
type decoded struct {
	typ watch.EventType
	obj *corev1.ConfigMap
}

// readEvents decodes n events, failing the test on any error.
func readEvents(t *testing.T, d *restclientwatch.Decoder, n int) []decoded {
	t.Helper()
	var out []decoded
	for i := 0; i < n; i++ {
		typ, obj, err := d.Decode()
		if err != nil {
			t.Fatalf("event %d of %d: %v", i+1, n, err)
		}
		c, ok := obj.(*corev1.ConfigMap)
		if !ok {
			t.Fatalf("event %d: %s %T, want a ConfigMap", i+1, typ, obj)
		}
		out = append(out, decoded{typ, c})
	}
	return out
}

// nextErr decodes one more event and returns the error it ends with (nil if an event came).
func nextErr(d *restclientwatch.Decoder) error {
	_, _, err := d.Decode()
	return err
}

// receive waits for one value on ch, failing the test after a deadline.
func receive(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// isCleanEnd reports whether err is how client-go's decoder reports a stream that ended
// between frames.
func isCleanEnd(err error) bool {
	return errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF)
}

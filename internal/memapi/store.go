package memapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
)

// optimisticLockMsg is the apiserver's message for an update or delete whose resourceVersion
// or precondition no longer holds.
const optimisticLockMsg = "the object has been modified; please apply your changes to the latest version and try again"

// object is one stored version of an object. It is never modified once stored.
type object struct {
	u   *unstructured.Unstructured
	raw []byte // u as JSON
}

func newObject(u *unstructured.Unstructured) (*object, error) {
	raw, err := json.Marshal(u.Object)
	if err != nil {
		return nil, fmt.Errorf("encoding %s: %w", u.GetName(), err)
	}
	return &object{u: u, raw: raw}, nil
}

// event is one write, as watches see it. It is never modified once in the history.
type event struct {
	typ  watch.EventType // Added, Modified or Deleted
	res  *resource
	key  string
	rv   uint64
	obj  *object // the object after the write; for a delete, the last state with the delete's RV
	prev *object // the object before the write; nil for Added
}

func key(ns, name string) string { return ns + "/" + name }

// commitLocked stores the result of a write at the next resourceVersion and wakes every watch.
// obj is nil for a delete. s.mu is held.
func (s *Server) commitLocked(typ watch.EventType, res *resource, k string, obj, prev *object) *event {
	s.rv++
	ev := &event{typ: typ, res: res, key: k, rv: s.rv, obj: obj, prev: prev}
	if typ == watch.Deleted {
		delete(res.objects, k)
	} else {
		res.objects[k] = obj
	}
	s.history = append(s.history, ev)
	if over := len(s.history) - s.historySize(); over > 0 {
		for i := range over {
			s.history[i] = nil // let the evicted events go
		}
		s.history = s.history[over:]
		s.floor += uint64(over)
	}
	close(s.changed)
	s.changed = make(chan struct{})
	return ev
}

// body reads the request body, bounded (3 MiB, as the apiserver's): it is not a stream. It
// says whether the body is protobuf (client-go's typed clients send built-in types that way by
// default) rather than JSON.
func (rq *request) body() (data []byte, protobuf bool, serr *apierrors.StatusError) {
	ct := rq.r.Header.Get("Content-Type")
	mt, _, _ := mime.ParseMediaType(ct)
	if ct != "" && mt != "application/json" && mt != protobufType {
		return nil, false, apierrors.NewGenericServerResponse(http.StatusUnsupportedMediaType, "", rq.res.gr, rq.name,
			"the body of the request was in an unknown format - accepted media types include: application/json, "+protobufType, 0, false)
	}
	data, err := io.ReadAll(http.MaxBytesReader(rq.w, rq.r.Body, maxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, false, apierrors.NewRequestEntityTooLargeError(fmt.Sprintf("limit is %d", maxBodyBytes))
		}
		return nil, false, apierrors.NewBadRequest(fmt.Sprintf("reading the request body: %v", err))
	}
	return data, mt == protobufType, nil
}

// readBody decodes a JSON request body into an object of rq's resource, checking its kind.
func (rq *request) readBody() (*unstructured.Unstructured, *apierrors.StatusError) {
	data, protobuf, serr := rq.body()
	if serr != nil {
		return nil, serr
	}
	var m map[string]any
	if protobuf {
		// client-go's typed clients send protobuf for built-in types by default.
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(data, nil, nil)
		if err == nil {
			m, err = runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		}
		if err != nil {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("the body of the request could not be decoded as protobuf: %v", err))
		}
	} else if err := utiljson.Unmarshal(data, &m); err != nil || m == nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("the body of the request could not be decoded as a JSON object: %v", err))
	}
	u := &unstructured.Unstructured{Object: m}
	if av := u.GetAPIVersion(); av != "" && av != "v1" {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("the API version in the data (%s) does not match the expected API version (v1)", av))
	}
	if k := u.GetKind(); k != "" && k != rq.res.Kind {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("the kind in the data (%s) does not match the expected kind (%s)", k, rq.res.Kind))
	}
	u.SetAPIVersion("v1")
	u.SetKind(rq.res.Kind)
	if md, ok := m["metadata"]; ok && !isMap(md) {
		return nil, apierrors.NewBadRequest("metadata must be an object")
	}
	if ns := u.GetNamespace(); rq.res.Namespaced && ns != "" && ns != rq.ns {
		return nil, apierrors.NewBadRequest("the namespace of the provided object does not match the namespace sent on the request")
	}
	if rq.res.Namespaced {
		u.SetNamespace(rq.ns)
	} else {
		u.SetNamespace("")
	}
	return u, nil
}

func isMap(v any) bool { _, ok := v.(map[string]any); return ok }

// protobufType is the media type of client-go's protobuf request bodies.
const protobufType = "application/vnd.kubernetes.protobuf"

// isDryRun reports whether the request asks for dryRun=All (as a query parameter, or for a
// delete in its options).
func isDryRun(rq *request, opts *metav1.DeleteOptions) bool {
	dry := rq.r.URL.Query()["dryRun"]
	if opts != nil {
		dry = append(dry, opts.DryRun...)
	}
	return slices.Contains(dry, metav1.DryRunAll)
}

func (rq *request) create() {
	s, res := rq.s, rq.res
	if res.Namespaced && rq.ns == "" {
		writeStatus(rq.w, errNotFoundPath())
		return
	}
	u, serr := rq.readBody()
	if serr != nil {
		writeStatus(rq.w, serr)
		return
	}
	if u.GetName() == "" {
		if gn := u.GetGenerateName(); gn != "" {
			u.SetName(gn + rand.String(5))
		} else {
			writeStatus(rq.w, apierrors.NewInvalid(res.gk(), "", field.ErrorList{
				field.Required(field.NewPath("metadata", "name"), "name or generateName is required")}))
			return
		}
	}
	u.SetResourceVersion("")
	u.SetUID(uuid.NewUUID())
	u.SetCreationTimestamp(metav1.NewTime(time.Now().Truncate(time.Second)))
	u.SetDeletionTimestamp(nil)

	s.mu.Lock()
	k := key(u.GetNamespace(), u.GetName())
	if _, exists := res.objects[k]; exists {
		s.mu.Unlock()
		writeStatus(rq.w, apierrors.NewAlreadyExists(res.gr, u.GetName()))
		return
	}
	u.SetResourceVersion(strconv.FormatUint(s.rv+1, 10))
	obj, err := newObject(u)
	if err != nil {
		s.mu.Unlock()
		writeStatus(rq.w, apierrors.NewInternalError(err))
		return
	}
	if !isDryRun(rq, nil) {
		s.commitLocked(watch.Added, res, k, obj, nil)
	}
	s.mu.Unlock()
	writeJSON(rq.w, http.StatusCreated, obj.raw)
}

func (rq *request) get() {
	s, res := rq.s, rq.res
	s.mu.Lock()
	obj, ok := res.objects[key(rq.ns, rq.name)]
	s.mu.Unlock()
	if !ok {
		writeStatus(rq.w, apierrors.NewNotFound(res.gr, rq.name))
		return
	}
	writeJSON(rq.w, http.StatusOK, obj.raw)
}

func (rq *request) update() {
	s, res := rq.s, rq.res
	u, serr := rq.readBody()
	if serr != nil {
		writeStatus(rq.w, serr)
		return
	}
	if u.GetName() != rq.name {
		writeStatus(rq.w, apierrors.NewBadRequest(fmt.Sprintf("the name of the object (%s) does not match the name on the URL (%s)", u.GetName(), rq.name)))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := key(u.GetNamespace(), rq.name)
	old, ok := res.objects[k]
	if !ok {
		writeStatus(rq.w, apierrors.NewNotFound(res.gr, rq.name))
		return
	}
	if rv := u.GetResourceVersion(); rv != "" && rv != old.u.GetResourceVersion() {
		writeStatus(rq.w, apierrors.NewConflict(res.gr, rq.name, errors.New(optimisticLockMsg)))
		return
	}
	if uid := u.GetUID(); uid != "" && uid != old.u.GetUID() {
		//lint:ignore ST1005 the apiserver's own wording, which clients may match
		writeStatus(rq.w, apierrors.NewConflict(res.gr, rq.name, fmt.Errorf("Precondition failed: UID in precondition: %s, UID in object meta: %s", uid, old.u.GetUID())))
		return
	}
	// What the client may not change.
	u.SetUID(old.u.GetUID())
	u.SetCreationTimestamp(old.u.GetCreationTimestamp())
	u.SetGenerateName(old.u.GetGenerateName())
	u.SetResourceVersion(old.u.GetResourceVersion())
	if reflect.DeepEqual(u.Object, old.u.Object) {
		// The apiserver does not write an unchanged object: same resourceVersion, no event.
		writeJSON(rq.w, http.StatusOK, old.raw)
		return
	}
	u.SetResourceVersion(strconv.FormatUint(s.rv+1, 10))
	obj, err := newObject(u)
	if err != nil {
		writeStatus(rq.w, apierrors.NewInternalError(err))
		return
	}
	if !isDryRun(rq, nil) {
		s.commitLocked(watch.Modified, res, k, obj, old)
	}
	writeJSON(rq.w, http.StatusOK, obj.raw)
}

func (rq *request) delete() {
	s, res := rq.s, rq.res
	var opts metav1.DeleteOptions
	data, protobuf, serr := rq.body()
	if serr != nil {
		writeStatus(rq.w, serr)
		return
	}
	if len(data) > 0 {
		var err error
		if protobuf {
			_, _, err = scheme.Codecs.UniversalDeserializer().Decode(data, nil, &opts)
		} else {
			err = json.Unmarshal(data, &opts)
		}
		if err != nil {
			writeStatus(rq.w, apierrors.NewBadRequest(fmt.Sprintf("the body of the request could not be decoded as DeleteOptions: %v", err)))
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := key(rq.ns, rq.name)
	old, ok := res.objects[k]
	if !ok {
		writeStatus(rq.w, apierrors.NewNotFound(res.gr, rq.name))
		return
	}
	if p := opts.Preconditions; p != nil {
		if p.UID != nil && *p.UID != old.u.GetUID() {
			//lint:ignore ST1005 the apiserver's own wording, which clients may match
			writeStatus(rq.w, apierrors.NewConflict(res.gr, rq.name, fmt.Errorf("Precondition failed: UID in precondition: %s, UID in object meta: %s", *p.UID, old.u.GetUID())))
			return
		}
		if p.ResourceVersion != nil && *p.ResourceVersion != old.u.GetResourceVersion() {
			//lint:ignore ST1005 the apiserver's own wording, which clients may match
			writeStatus(rq.w, apierrors.NewConflict(res.gr, rq.name, fmt.Errorf("Precondition failed: ResourceVersion in precondition: %s, ResourceVersion in object meta: %s", *p.ResourceVersion, old.u.GetResourceVersion())))
			return
		}
	}
	// The DELETED event carries the last state stamped with the delete's revision, as the
	// apiserver has done since 1.7.13 / 1.8.8 / 1.9.3 (kubernetes#58547).
	gone := old.u.DeepCopy()
	gone.SetResourceVersion(strconv.FormatUint(s.rv+1, 10))
	obj, err := newObject(gone)
	if err != nil {
		writeStatus(rq.w, apierrors.NewInternalError(err))
		return
	}
	if !isDryRun(rq, &opts) {
		s.commitLocked(watch.Deleted, res, k, obj, old)
	}
	st := &metav1.Status{
		Status: metav1.StatusSuccess,
		Details: &metav1.StatusDetails{
			Name: rq.name,
			Kind: res.Name,
			UID:  old.u.GetUID(),
		},
	}
	writeStatusObject(rq.w, http.StatusOK, st)
}

// snapshotLocked returns the objects of res in namespace ns ("" for all) that match sel, as
// they were at resourceVersion at (s.rv for the current state), sorted by namespace and name.
// at must be >= s.floor. s.mu is held.
func (s *Server) snapshotLocked(res *resource, ns string, sel selector, at uint64) []*object {
	objects := res.objects
	if at < s.rv {
		objects = make(map[string]*object, len(res.objects))
		for k, o := range res.objects {
			objects[k] = o
		}
		// Undo the writes after at, newest first.
		for i := len(s.history) - 1; i >= 0 && s.history[i].rv > at; i-- {
			ev := s.history[i]
			if ev.res != res {
				continue
			}
			if ev.prev == nil {
				delete(objects, ev.key)
			} else {
				objects[ev.key] = ev.prev
			}
		}
	}
	out := make([]*object, 0, len(objects))
	for _, o := range objects {
		if ns != "" && o.u.GetNamespace() != ns {
			continue
		}
		if sel.matches(o) {
			out = append(out, o)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].u, out[j].u
		if a.GetNamespace() != b.GetNamespace() {
			return a.GetNamespace() < b.GetNamespace()
		}
		return a.GetName() < b.GetName()
	})
	return out
}

package demo

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
)

// Handler names, as client-go's ResourceEventHandler calls them.
const (
	OnAdd    = "OnAdd"
	OnUpdate = "OnUpdate"
	OnDelete = "OnDelete"
)

// Call is one call of an informer's event handlers.
type Call struct {
	Handler string // OnAdd, OnUpdate or OnDelete
	Name    string
	RV      string // the resourceVersion of the object handed to the handler
	// OldRV is, for OnUpdate, the resourceVersion of the object it replaced in the store.
	OldRV string
	// InitialList marks an OnAdd for the informer's initial list.
	InitialList bool

	// Set by judging against the truth:
	Verdict Verdict
	// Truth is the index in Result.Truth of the write this call reports (also for a replay:
	// the write replayed); -1 if none.
	Truth int
	// Note explains a verdict other than Faithful for a person.
	Note string
}

// recorder records every handler call of an informer.
type recorder struct {
	mu    sync.Mutex
	calls []Call
}

func (r *recorder) handlers() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			if s, ok := obj.(*corev1.Service); ok {
				r.record(Call{Handler: OnAdd, Name: s.Name, RV: s.ResourceVersion, InitialList: initial})
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.Service)
			s, ok2 := newObj.(*corev1.Service)
			if ok1 && ok2 {
				r.record(Call{Handler: OnUpdate, Name: s.Name, RV: s.ResourceVersion, OldRV: o.ResourceVersion})
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if s, ok := obj.(*corev1.Service); ok {
				r.record(Call{Handler: OnDelete, Name: s.Name, RV: s.ResourceVersion})
			}
		},
	}
}

func (r *recorder) record(c Call) {
	c.Truth = -1
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
}

func (r *recorder) snapshot() []Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Call(nil), r.calls...)
}

func (r *recorder) sawAdd(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.calls {
		if c.Handler == OnAdd && c.Name == name {
			return true
		}
	}
	return false
}

package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

const cmPath = "/api/v1/namespaces/ns/configmaps"

// The deletion of a in the middle: its DELETED event must come out with a's previous
// resourceVersion (99, two digits where the delete's 100 has three, so lengths change), every
// other event byte for byte as the apiserver wrote it.
func deleteScript() script {
	a := cm("a", "uid-a", "97")
	aMod := cm("a", "uid-a", "99")
	aMod.Data["key"] = "changed"
	aDel := aMod.DeepCopy()
	aDel.ResourceVersion = "100"
	return script{events: []evt{
		{watch.Added, a},
		{watch.Added, cm("b", "uid-b", "98")},
		{watch.Modified, aMod},
		{watch.Deleted, aDel},
		{watch.Added, cm("c", "uid-c", "101")},
	}, hold: true}
}

func TestDeleteOldRV(t *testing.T) {
	for _, f := range allFormats {
		t.Run(f.name, func(t *testing.T) {
			sc := deleteScript()
			st := newSetup(t, newStandIn(t, map[string]script{"ns": sc}))
			if err := st.layer.Set(Faults{DeleteOldRV: true}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			// The client asks for gzip, as Go's client does; the layer must still get identity
			// from upstream to read the stream.
			resp := st.openWatch(t, ctx, cmPath, f, http.Header{"Accept-Encoding": {"gzip"}})
			defer resp.Body.Close()
			if ce := resp.Header.Get("Content-Encoding"); ce != "" {
				t.Fatalf("response Content-Encoding %q, want none", ce)
			}
			if ct := resp.Header.Get("Content-Type"); ct != f.contentType {
				t.Errorf("Content-Type %q, want %q", ct, f.contentType)
			}
			var raw bytes.Buffer
			got := readEvents(t, f.decoder(io.NopCloser(io.TeeReader(resp.Body, &raw))), 5)

			wantRV := []string{"97", "98", "99", "99", "101"}
			for i, e := range got {
				if e.typ != sc.events[i].typ || e.obj.ResourceVersion != wantRV[i] {
					t.Errorf("event %d: %s rv %s, want %s rv %s", i, e.typ, e.obj.ResourceVersion, sc.events[i].typ, wantRV[i])
				}
			}
			// The deleted object is the apiserver's, but for its resourceVersion.
			want := sc.events[3].obj.(*corev1.ConfigMap).DeepCopy()
			want.ResourceVersion = "99"
			got[3].obj.TypeMeta = want.TypeMeta
			if !apiequality.Semantic.DeepEqual(got[3].obj, want) {
				t.Errorf("DELETED object:\n got %#v\nwant %#v", got[3].obj, want)
			}
			// Byte for byte: every other frame untouched, the delete's exactly the apiserver's
			// encoding of the object with the old resourceVersion.
			frames := sc.frames(t, f)
			wantBytes := bytes.Join([][]byte{frames[0], frames[1], frames[2], f.frame(t, watch.Deleted, want), frames[4]}, nil)
			if !bytes.Equal(raw.Bytes(), wantBytes) {
				t.Errorf("stream bytes differ from the apiserver's with the delete rewritten:\n got %q\nwant %q", raw.Bytes(), wantBytes)
			}

			ws := st.standIn.watchRequests()
			if len(ws) != 1 || ws[0].Header.Get("Accept-Encoding") != "identity" {
				t.Errorf("upstream watch Accept-Encoding %q, want identity", ws[0].Header.Get("Accept-Encoding"))
			}
			s := st.layer.Stats()
			if s.Watches != 1 || s.DeletesRewritten != 1 || s.DeletesUnknown != 0 || s.Lookups != 0 {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

// Without the fault, the layer is invisible: the stream is the apiserver's, byte for byte.
func TestNoFaultsPassesStreamUnchanged(t *testing.T) {
	for _, f := range allFormats {
		t.Run(f.name, func(t *testing.T) {
			sc := deleteScript()
			sc.hold = false
			st := newSetup(t, newStandIn(t, map[string]script{"ns": sc}))
			resp := st.openWatch(t, context.Background(), cmPath, f, nil)
			defer resp.Body.Close()
			var raw bytes.Buffer
			if _, err := io.Copy(&raw, resp.Body); err != nil {
				t.Fatalf("reading the stream: %v", err)
			}
			if want := bytes.Join(sc.frames(t, f), nil); !bytes.Equal(raw.Bytes(), want) {
				t.Errorf("stream changed:\n got %q\nwant %q", raw.Bytes(), want)
			}
		})
	}
}

// The layer never saw the object change, so it asks the apiserver: a LIST at exactly the
// delete's revision minus one, with the watch's credentials.
func TestDeleteOldRVFallbackList(t *testing.T) {
	for _, tc := range []struct {
		name, watchPath string
	}{
		{"namespaced", cmPath},
		{"all namespaces", "/api/v1/configmaps"},
		{"legacy watch path", "/api/v1/watch/namespaces/ns/configmaps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			del := cm("a", "uid-a", "50")
			s := newStandIn(t, map[string]script{namespaceOf(tc.watchPath): {events: []evt{
				{watch.Deleted, del},
				{watch.Added, cm("b", "uid-b", "51")},
			}, hold: true}})
			s.list = func(w http.ResponseWriter, r *http.Request) {
				q := r.URL.Query()
				if r.URL.Path != cmPath || q.Get("resourceVersion") != "49" || q.Get("resourceVersionMatch") != "Exact" ||
					q.Get("fieldSelector") != "metadata.name=a" || r.Header.Get("Authorization") != "Bearer secret" {
					http.Error(w, "unexpected list "+r.URL.String(), http.StatusBadRequest)
					return
				}
				old := cm("a", "uid-a", "42")
				list := &corev1.ConfigMapList{TypeMeta: metav1.TypeMeta{Kind: "ConfigMapList", APIVersion: "v1"},
					ListMeta: metav1.ListMeta{ResourceVersion: "49"}, Items: []corev1.ConfigMap{*old}}
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(list)
			}
			st := newSetup(t, s)
			if err := st.layer.Set(Faults{DeleteOldRV: true}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp := st.get(t, ctx, tc.watchPath+"?watch=true", jsonFormat, http.Header{"Authorization": {"Bearer secret"}})
			defer resp.Body.Close()
			got := readEvents(t, jsonFormat.decoder(resp.Body), 2)
			if got[0].typ != watch.Deleted || got[0].obj.ResourceVersion != "42" {
				t.Errorf("first event %s rv %s, want DELETED rv 42", got[0].typ, got[0].obj.ResourceVersion)
			}
			if got[1].obj.ResourceVersion != "51" {
				t.Errorf("second event rv %s, want 51", got[1].obj.ResourceVersion)
			}
			if n := len(s.listRequests()); n != 1 {
				t.Errorf("%d LIST requests, want 1", n)
			} else if a := s.listRequests()[0].Header.Get("Accept"); a != "application/json" {
				t.Errorf("LIST Accept %q", a)
			}
			if st := st.layer.Stats(); st.Lookups != 1 || st.LookupsFailed != 0 || st.DeletesRewritten != 1 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// When the apiserver cannot say (the revision is compacted), the delete passes unchanged.
func TestDeleteOldRVUnknown(t *testing.T) {
	s := newStandIn(t, map[string]script{"ns": {events: []evt{{watch.Deleted, cm("a", "uid-a", "50")}}, hold: true}})
	s.list = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusGone)
		_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":410}`)
	}
	st := newSetup(t, s)
	if err := st.layer.Set(Faults{DeleteOldRV: true}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := st.openWatch(t, ctx, cmPath, protoFormat, nil)
	defer resp.Body.Close()
	got := readEvents(t, protoFormat.decoder(resp.Body), 1)
	if got[0].obj.ResourceVersion != "50" {
		t.Errorf("DELETED rv %s, want 50 (unchanged)", got[0].obj.ResourceVersion)
	}
	if st := st.layer.Stats(); st.DeletesUnknown != 1 || st.LookupsFailed != 1 || st.DeletesRewritten != 0 {
		t.Errorf("stats %+v", st)
	}
}

// Objects seen on one watch serve another: a lagging watch's older event does not lower what
// the layer remembers.
func TestDeleteOldRVRemembersAcrossWatches(t *testing.T) {
	aDel := cm("a", "uid-a", "30")
	s := newStandIn(t, map[string]script{
		"first":  {events: []evt{{watch.Added, cm("a", "uid-a", "10")}, {watch.Modified, cm("a", "uid-a", "20")}}},
		"second": {events: []evt{{watch.Added, cm("a", "uid-a", "10")}, {watch.Deleted, aDel}}, hold: true},
	})
	st := newSetup(t, s)
	if err := st.layer.Set(Faults{DeleteOldRV: true}); err != nil {
		t.Fatal(err)
	}
	resp := st.openWatch(t, context.Background(), "/api/v1/namespaces/first/configmaps", jsonFormat, nil)
	readEvents(t, jsonFormat.decoder(resp.Body), 2)
	resp.Body.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp = st.openWatch(t, ctx, "/api/v1/namespaces/second/configmaps", cborFormat, nil)
	defer resp.Body.Close()
	got := readEvents(t, cborFormat.decoder(resp.Body), 2)
	if got[1].typ != watch.Deleted || got[1].obj.ResourceVersion != "20" {
		t.Errorf("%s rv %s, want DELETED rv 20", got[1].typ, got[1].obj.ResourceVersion)
	}
	if n := len(s.listRequests()); n != 0 {
		t.Errorf("%d fallback LISTs, want none", n)
	}
}

func TestEndWatchAfterDelete(t *testing.T) {
	for _, f := range allFormats {
		t.Run(f.name, func(t *testing.T) {
			s := newStandIn(t, map[string]script{"ns": {events: []evt{
				{watch.Added, cm("a", "uid-a", "10")},
				{watch.Deleted, cm("a", "uid-a", "11")},
				{watch.Added, cm("b", "uid-b", "12")},
			}, hold: true}})
			st := newSetup(t, s)
			if err := st.layer.Set(Faults{DeleteOldRV: true, EndWatchAfterDelete: true}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp := st.openWatch(t, ctx, cmPath, f, nil)
			d := f.decoder(resp.Body)
			got := readEvents(t, d, 2)
			if got[1].typ != watch.Deleted || got[1].obj.ResourceVersion != "10" {
				t.Errorf("%s rv %s, want DELETED rv 10", got[1].typ, got[1].obj.ResourceVersion)
			}
			// The upstream holds its watch open; the layer ended the client's cleanly.
			if err := nextErr(d); !isCleanEnd(err) {
				t.Fatalf("after the delete: %v, want a clean end (io.EOF)", err)
			}
			resp.Body.Close()
			receive(t, "the upstream watch to be cancelled", s.watchEnded)

			// The re-watch replays the delete: it runs through this time, as the next periodic
			// re-watch would come minutes later.
			resp = st.openWatch(t, ctx, cmPath, f, nil)
			defer resp.Body.Close()
			got = readEvents(t, f.decoder(resp.Body), 3)
			if got[2].obj.Name != "b" {
				t.Errorf("third event %s %s, want b", got[2].typ, got[2].obj.Name)
			}
			if s := st.layer.Stats(); s.EndedAfterDelete != 1 || s.DeletesRewritten != 2 {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

func tenEvents() script {
	var sc script
	for i := 0; i < 10; i++ {
		sc.events = append(sc.events, evt{watch.Added, cm(string(rune('a'+i)), "uid", "1"+string(rune('0'+i)))})
	}
	sc.hold = true
	return sc
}

func TestResetEveryN(t *testing.T) {
	for _, tc := range []struct {
		name    string
		faults  Faults
		opts    []setupOption
		wantErr func(error) bool
	}{
		{"http1 abort", Faults{ResetEveryN: 3}, nil, func(err error) bool { return errors.Is(err, io.ErrUnexpectedEOF) }},
		{"http1 tcp", Faults{ResetEveryN: 3, ResetTCP: true}, nil, func(err error) bool { return errors.Is(err, syscall.ECONNRESET) }},
		{"http2 abort", Faults{ResetEveryN: 3}, []setupOption{withHTTP2}, func(err error) bool { return strings.Contains(err.Error(), "stream error") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, f := range allFormats {
				t.Run(f.name, func(t *testing.T) {
					st := newSetup(t, newStandIn(t, map[string]script{"ns": tenEvents()}), tc.opts...)
					if err := st.layer.Set(tc.faults); err != nil {
						t.Fatal(err)
					}
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					for attempt := 1; attempt <= 2; attempt++ { // every watch gets N events
						resp := st.openWatch(t, ctx, cmPath, f, nil)
						if len(tc.opts) > 0 && resp.ProtoMajor != 2 {
							t.Fatalf("served over %s, want HTTP/2", resp.Proto)
						}
						d := f.decoder(resp.Body)
						got := readEvents(t, d, 3)
						if got[2].obj.Name != "c" {
							t.Errorf("third event is %s, want c", got[2].obj.Name)
						}
						err := nextErr(d)
						if err == nil || isCleanEnd(err) || !tc.wantErr(err) {
							t.Fatalf("watch %d after 3 events: %v, want a broken stream", attempt, err)
						}
						resp.Body.Close()
					}
					if s := st.layer.Stats(); s.Resets != 2 {
						t.Errorf("stats %+v", s)
					}
				})
			}
		})
	}
}

// Over HTTP/2 with ConnContext, ResetTCP kills the whole connection: a second watch on it
// breaks too, as when an apiserver dies.
func TestResetTCPHTTP2KillsConnection(t *testing.T) {
	s := newStandIn(t, map[string]script{
		"ns":    tenEvents(),
		"quiet": {events: []evt{{watch.Added, cm("q", "uid-q", "5")}}, hold: true},
	})
	st := newSetup(t, s, withHTTP2, func(srv *httptest.Server, _ *Layer) { srv.Config.ConnContext = ConnContext })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	quiet := st.openWatch(t, ctx, "/api/v1/namespaces/quiet/configmaps", jsonFormat, nil)
	defer quiet.Body.Close()
	qd := jsonFormat.decoder(quiet.Body)
	readEvents(t, qd, 1)

	if err := st.layer.Set(Faults{ResetEveryN: 3, ResetTCP: true}); err != nil {
		t.Fatal(err)
	}
	resp := st.openWatch(t, ctx, cmPath, jsonFormat, nil)
	defer resp.Body.Close()
	d := jsonFormat.decoder(resp.Body)
	var n int
	var err error
	for err == nil {
		if _, _, err = d.Decode(); err == nil {
			n++
		}
	}
	if n > 3 || isCleanEnd(err) {
		t.Errorf("reset watch: %d events then %v, want at most 3 then an error", n, err)
	}
	// The quiet watch never gets another event; only the dead connection ends it.
	if err := nextErr(qd); err == nil || isCleanEnd(err) || ctx.Err() != nil {
		t.Errorf("quiet watch on the same connection: %v, want a connection error", err)
	}
}

func TestFail503FirstK(t *testing.T) {
	s := newStandIn(t, map[string]script{"ns": {events: []evt{{watch.Added, cm("a", "uid-a", "1")}}}})
	s.list = func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, `{"kind":"ConfigMapList"}`) }
	st := newSetup(t, s)
	if err := st.layer.Set(Faults{Fail503FirstK: 2}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	refused := func() {
		t.Helper()
		resp := st.get(t, ctx, cmPath+"?watch=1", protoFormat, nil)
		defer resp.Body.Close()
		var status metav1.Status
		if err := json.NewDecoder(resp.Body).Decode(&status); err != nil {
			t.Fatalf("decoding the 503 body: %v", err)
		}
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" ||
			resp.Header.Get("Content-Type") != "application/json" ||
			status.Kind != "Status" || status.Code != 503 || status.Reason != metav1.StatusReasonServiceUnavailable ||
			status.Message != "apiserver is shutting down" {
			t.Errorf("got %s %v %+v, want the apiserver's shutting-down 503", resp.Status, resp.Header, status)
		}
	}
	passes := func() {
		t.Helper()
		resp := st.openWatch(t, ctx, cmPath, protoFormat, nil)
		defer resp.Body.Close()
		readEvents(t, protoFormat.decoder(resp.Body), 1)
	}
	refused()
	// A non-watch request is not a watch attempt: it passes and does not count.
	resp := st.get(t, ctx, cmPath, jsonFormat, nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("LIST through the layer: %s", resp.Status)
	}
	refused()
	passes()
	passes()
	if n := len(s.watchRequests()); n != 2 {
		t.Errorf("upstream saw %d watches, want 2 (the refused ones never reach it)", n)
	}
	// A new Set starts counting again.
	if err := st.layer.Set(Faults{Fail503FirstK: 1}); err != nil {
		t.Fatal(err)
	}
	refused()
	passes()
	if s := st.layer.Stats(); s.Refused503 != 3 || s.Watches != 6 {
		t.Errorf("stats %+v", s)
	}
}

func TestStallAfterN(t *testing.T) {
	for _, f := range allFormats {
		t.Run(f.name, func(t *testing.T) {
			s := newStandIn(t, map[string]script{"ns": tenEvents()})
			st := newSetup(t, s)
			if err := st.layer.Set(Faults{StallAfterN: 2}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp := st.openWatch(t, ctx, cmPath, f, nil)
			defer resp.Body.Close()
			d := f.decoder(resp.Body)
			readEvents(t, d, 2)
			// The stalled layer cancels its upstream watch at once...
			receive(t, "the upstream watch to be cancelled", s.watchEnded)
			// ...yet holds the client's: no event and no end within a deadline.
			errc := make(chan error, 1)
			go func() { errc <- nextErr(d) }()
			select {
			case err := <-errc:
				t.Fatalf("stalled watch returned %v, want it held open", err)
			case <-time.After(300 * time.Millisecond):
			}
			if s := st.layer.Stats(); s.Stalls != 1 {
				t.Errorf("stats %+v", s)
			}
			// The client going away releases it.
			cancel()
			if err := <-errc; err == nil || isCleanEnd(err) {
				t.Errorf("after the client gave up: %v", err)
			}
			receive(t, "the layer's handler to return", st.handlerDone)
		})
	}
}

func TestGoAway(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(map[bool]string{false: "off", true: "on"}[on], func(t *testing.T) {
			s := newStandIn(t, map[string]script{"ns": {events: []evt{
				{watch.Added, cm("a", "uid-a", "1")}, {watch.Added, cm("b", "uid-b", "2")},
			}, hold: true}})
			s.list = func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, `{}`) }
			newConns := make(chan struct{}, 10)
			st := newSetup(t, s, withHTTP2, func(srv *httptest.Server, _ *Layer) {
				srv.Config.ConnState = func(_ net.Conn, cs http.ConnState) {
					if cs == http.StateNew {
						newConns <- struct{}{}
					}
				}
			})
			if err := st.layer.Set(Faults{GoAway: on}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp := st.openWatch(t, ctx, cmPath, jsonFormat, nil)
			defer resp.Body.Close()
			if resp.ProtoMajor != 2 {
				t.Fatalf("served over %s, want HTTP/2", resp.Proto)
			}
			d := jsonFormat.decoder(resp.Body)
			readEvents(t, d, 1)
			// The watch goes on after the GOAWAY...
			readEvents(t, d, 1)
			// ...but the next request needs a new connection.
			resp2 := st.get(t, ctx, cmPath, jsonFormat, nil)
			resp2.Body.Close()
			if want := map[bool]int{false: 1, true: 2}[on]; len(newConns) != want {
				t.Errorf("%d connections, want %d", len(newConns), want)
			}
			if s := st.layer.Stats(); s.GoAways != map[bool]int64{false: 0, true: 1}[on] {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

// Garbage from upstream: what came before it is delivered, then the response ends cleanly.
func TestUpstreamGarbage(t *testing.T) {
	for _, tc := range []struct {
		name     string
		f        wireFormat
		garbage  []byte
		maxFrame int
	}{
		{"json", jsonFormat, []byte("{\"type\":\"ADDED\",\"object\":\x01}\n"), 0},
		{"protobuf oversized", protoFormat, append([]byte{0, 1, 0, 0}, make([]byte, 65536)...), 4096},
		{"cbor", cborFormat, []byte{0xd9, 0xd9, 0xf7, 0xff, 0xff}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStandIn(t, map[string]script{"ns": {
				events: []evt{{watch.Added, cm("a", "uid-a", "1")}},
				then: func(w http.ResponseWriter, r *http.Request) {
					_, _ = w.Write(tc.garbage)
					_ = http.NewResponseController(w).Flush()
				},
				hold: true,
			}})
			st := newSetup(t, s, func(_ *httptest.Server, l *Layer) { l.MaxFrame = tc.maxFrame })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp := st.openWatch(t, ctx, cmPath, tc.f, nil)
			defer resp.Body.Close()
			d := tc.f.decoder(resp.Body)
			readEvents(t, d, 1)
			if err := nextErr(d); !isCleanEnd(err) {
				t.Errorf("after garbage: %v, want a clean end", err)
			}
			receive(t, "the upstream watch to be cancelled", s.watchEnded)
			if s := st.layer.Stats(); s.UpstreamGarbage != 1 {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

// An upstream that breaks mid-stream breaks the client's stream too: the layer does not turn
// a failure into a clean end.
func TestUpstreamAbortIsMirrored(t *testing.T) {
	s := newStandIn(t, map[string]script{"ns": {
		events: []evt{{watch.Added, cm("a", "uid-a", "1")}, {watch.Added, cm("b", "uid-b", "2")}},
		then:   func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) },
	}})
	st := newSetup(t, s)
	if err := st.layer.Set(Faults{DeleteOldRV: true}); err != nil {
		t.Fatal(err)
	}
	resp := st.openWatch(t, context.Background(), cmPath, protoFormat, nil)
	defer resp.Body.Close()
	d := protoFormat.decoder(resp.Body)
	readEvents(t, d, 2)
	if err := nextErr(d); err == nil || isCleanEnd(err) {
		t.Errorf("after the upstream broke: %v, want an error", err)
	}
	if s := st.layer.Stats(); s.UpstreamGarbage != 0 {
		t.Errorf("an upstream abort counted as garbage: %+v", s)
	}
}

// What the layer does not touch passes unchanged: errors on watches, and every non-watch
// request (its Accept-Encoding included).
func TestPassThrough(t *testing.T) {
	s := newStandIn(t, nil) // no scripts: watches get 404
	s.list = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Seen-Accept-Encoding", r.Header.Get("Accept-Encoding"))
		_, _ = io.WriteString(w, `{"kind":"ConfigMapList","items":[]}`)
	}
	st := newSetup(t, s)
	if err := st.layer.Set(Faults{DeleteOldRV: true, ResetEveryN: 1}); err != nil {
		t.Fatal(err)
	}
	resp := st.get(t, context.Background(), cmPath+"?watch=1", jsonFormat, nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "no script") {
		t.Errorf("watch error: %s %q, want the upstream's 404", resp.Status, body)
	}
	resp = st.get(t, context.Background(), cmPath, jsonFormat, http.Header{"Accept-Encoding": {"gzip"}})
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != `{"kind":"ConfigMapList","items":[]}` ||
		resp.Header.Get("X-Seen-Accept-Encoding") != "gzip" {
		t.Errorf("list: %s %v %q", resp.Status, resp.Header, body)
	}
	if s := st.layer.Stats(); s.Watches != 1 || s.Resets != 0 {
		t.Errorf("stats %+v", s)
	}
}

// A client going away ends everything: the layer's handler and the upstream watch.
func TestClientGoneCancelsUpstream(t *testing.T) {
	s := newStandIn(t, map[string]script{"ns": {events: []evt{{watch.Added, cm("a", "uid-a", "1")}}, hold: true}})
	st := newSetup(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	resp := st.openWatch(t, ctx, cmPath, cborFormat, nil)
	readEvents(t, cborFormat.decoder(resp.Body), 1)
	cancel()
	resp.Body.Close()
	receive(t, "the upstream watch to be cancelled", s.watchEnded)
	receive(t, "the layer's handler to return", st.handlerDone)
}

func TestSetFlipsFaultsMidWatch(t *testing.T) {
	release := make(chan struct{})
	s := newStandIn(t, map[string]script{"ns": {
		events: []evt{{watch.Added, cm("a", "uid-a", "10")}, {watch.Deleted, cm("a", "uid-a", "11")}},
		then: func(w http.ResponseWriter, r *http.Request) {
			<-release
			_, _ = w.Write(jsonFormat.frame(t, watch.Added, cm("b", "uid-b", "12")))
			_, _ = w.Write(jsonFormat.frame(t, watch.Deleted, cm("b", "uid-b", "13")))
			_ = http.NewResponseController(w).Flush()
		},
		hold: true,
	}})
	st := newSetup(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := st.openWatch(t, ctx, cmPath, jsonFormat, nil)
	defer resp.Body.Close()
	d := jsonFormat.decoder(resp.Body)
	if got := readEvents(t, d, 2); got[1].obj.ResourceVersion != "11" {
		t.Errorf("delete before the fault: rv %s, want 11", got[1].obj.ResourceVersion)
	}
	if err := st.layer.Set(Faults{DeleteOldRV: true}); err != nil {
		t.Fatal(err)
	}
	close(release)
	if got := readEvents(t, d, 2); got[1].obj.ResourceVersion != "12" {
		t.Errorf("delete after the fault was set: rv %s, want 12", got[1].obj.ResourceVersion)
	}
}

func TestValidate(t *testing.T) {
	l := New(http.NotFoundHandler(), nil)
	if err := l.Set(Faults{DeleteOldRV: true}); err != nil {
		t.Fatal(err)
	}
	err := l.Set(Faults{ResetEveryN: -1, StallAfterN: -2, Fail503FirstK: -3, ResetTCP: true})
	if err == nil {
		t.Fatal("invalid faults accepted")
	}
	for _, want := range []string{"ResetEveryN", "StallAfterN", "Fail503FirstK", "ResetTCP needs ResetEveryN"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
	if !l.Faults().DeleteOldRV {
		t.Error("a refused Set changed the active faults")
	}
}

func TestListPath(t *testing.T) {
	for _, tc := range []struct{ watch, ns, want string }{
		{"/api/v1/namespaces/ns/configmaps", "ns", "/api/v1/namespaces/ns/configmaps"},
		{"/api/v1/configmaps", "ns", "/api/v1/namespaces/ns/configmaps"},
		{"/api/v1/watch/namespaces/ns/configmaps", "ns", "/api/v1/namespaces/ns/configmaps"},
		{"/api/v1/watch/namespaces/ns/configmaps/a", "ns", "/api/v1/namespaces/ns/configmaps"},
		{"/api/v1/watch/configmaps", "ns", "/api/v1/namespaces/ns/configmaps"},
		{"/api/v1/namespaces", "", "/api/v1/namespaces"},
		{"/api/v1/watch/namespaces/foo", "", "/api/v1/namespaces"},
		{"/apis/apps/v1/namespaces/ns/deployments", "ns", "/apis/apps/v1/namespaces/ns/deployments"},
		{"/apis/rbac.authorization.k8s.io/v1/clusterroles", "", "/apis/rbac.authorization.k8s.io/v1/clusterroles"},
	} {
		got, err := listPath(tc.watch, tc.ns)
		if err != nil || got != tc.want {
			t.Errorf("listPath(%q, %q) = %q, %v; want %q", tc.watch, tc.ns, got, err, tc.want)
		}
	}
	for _, bad := range []string{"/", "/healthz", "/api/v1", "/apis/apps/v1"} {
		if got, err := listPath(bad, ""); err == nil {
			t.Errorf("listPath(%q) = %q, want an error", bad, got)
		}
	}
}

// EndImmediately: a watch opened while it is set gets its headers and a clean end, no event; a
// watch already running ends cleanly after its next event. Requests counts every request.
func TestEndImmediately(t *testing.T) {
	for _, f := range allFormats {
		t.Run(f.name, func(t *testing.T) {
			release := make(chan struct{})
			s := newStandIn(t, map[string]script{"ns": {
				events: []evt{{watch.Added, cm("a", "uid-a", "10")}},
				then: func(w http.ResponseWriter, r *http.Request) {
					select {
					case <-release:
					case <-r.Context().Done():
						return
					}
					_, _ = w.Write(f.frame(t, watch.Added, cm("b", "uid-b", "11")))
					_, _ = w.Write(f.frame(t, watch.Added, cm("c", "uid-c", "12")))
					_ = http.NewResponseController(w).Flush()
				},
				hold: true,
			}})
			st := newSetup(t, s)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			running := st.openWatch(t, ctx, cmPath, f, nil)
			defer running.Body.Close()
			rd := f.decoder(running.Body)
			readEvents(t, rd, 1)

			if err := st.layer.Set(Faults{EndImmediately: true}); err != nil {
				t.Fatal(err)
			}
			fresh := st.openWatch(t, ctx, cmPath, f, nil)
			if fresh.StatusCode != http.StatusOK {
				t.Fatalf("new watch: %s, want 200", fresh.Status)
			}
			if err := nextErr(f.decoder(fresh.Body)); !isCleanEnd(err) {
				t.Errorf("new watch: %v, want a clean end before any event", err)
			}
			fresh.Body.Close()

			close(release)
			if got := readEvents(t, rd, 1); got[0].obj.Name != "b" {
				t.Errorf("running watch's next event is %s, want b", got[0].obj.Name)
			}
			if err := nextErr(rd); !isCleanEnd(err) {
				t.Errorf("running watch after its next event: %v, want a clean end", err)
			}
			if s := st.layer.Stats(); s.EndedImmediately != 2 || s.Watches != 2 || s.Requests != 2 {
				t.Errorf("stats %+v, want 2 ended at once of 2 watches, 2 requests", s)
			}
		})
	}
}

// Requests counts everything the layer serves, watches or not.
func TestRequestsCounted(t *testing.T) {
	s := newStandIn(t, nil)
	s.list = func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"kind":"ConfigMapList","items":[]}`)
	}
	st := newSetup(t, s)
	for range 3 {
		resp := st.get(t, context.Background(), cmPath, jsonFormat, nil)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if s := st.layer.Stats(); s.Requests != 3 || s.Watches != 0 {
		t.Errorf("stats %+v, want 3 requests, no watch", s)
	}
}

// EndIdleAfter cuts a watch that wrote nothing for the period, cleanly, and only then: events
// closer together than the period keep it open.
func TestEndIdleAfter(t *testing.T) {
	const idle = time.Second
	for _, f := range allFormats {
		t.Run(f.name, func(t *testing.T) {
			s := newStandIn(t, map[string]script{"ns": {
				events: []evt{{watch.Added, cm("a", "uid-a", "10")}},
				then: func(w http.ResponseWriter, r *http.Request) {
					for i, name := range []string{"b", "c"} {
						select {
						case <-time.After(idle / 4):
						case <-r.Context().Done():
							return
						}
						_, _ = w.Write(f.frame(t, watch.Added, cm(name, "uid-"+name, strconv.Itoa(11+i))))
						_ = http.NewResponseController(w).Flush()
					}
				},
				hold: true,
			}})
			st := newSetup(t, s)
			if err := st.layer.Set(Faults{EndIdleAfter: idle}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp := st.openWatch(t, ctx, cmPath, f, nil)
			defer resp.Body.Close()
			d := f.decoder(resp.Body)
			got := readEvents(t, d, 3)
			last := time.Now()
			if got[2].obj.Name != "c" {
				t.Fatalf("third event %s, want c", got[2].obj.Name)
			}
			if err := nextErr(d); !isCleanEnd(err) {
				t.Fatalf("after the idle period: %v, want a clean end", err)
			}
			if quiet := time.Since(last); quiet < idle-50*time.Millisecond {
				t.Errorf("cut %v after the last event, want at least %v", quiet, idle)
			}
			receive(t, "the upstream watch to be cancelled", s.watchEnded)
			if s := st.layer.Stats(); s.EndedIdle != 1 || s.UpstreamGarbage != 0 {
				t.Errorf("stats %+v, want 1 ended idle, no garbage", s)
			}
		})
	}
}

// DropBookmarks leaves bookmarks out, every other event passes.
func TestDropBookmarks(t *testing.T) {
	for _, f := range allFormats {
		t.Run(f.name, func(t *testing.T) {
			bm := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{Kind: "ConfigMap", APIVersion: "v1"},
				ObjectMeta: metav1.ObjectMeta{ResourceVersion: "11"}}
			s := newStandIn(t, map[string]script{"ns": {events: []evt{
				{watch.Added, cm("a", "uid-a", "10")},
				{watch.Bookmark, bm},
				{watch.Added, cm("b", "uid-b", "12")},
			}}})
			st := newSetup(t, s)
			if err := st.layer.Set(Faults{DropBookmarks: true}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp := st.openWatch(t, ctx, cmPath, f, nil)
			defer resp.Body.Close()
			d := f.decoder(resp.Body)
			got := readEvents(t, d, 2)
			if got[0].obj.Name != "a" || got[1].typ != watch.Added || got[1].obj.Name != "b" {
				t.Errorf("got %s %s, %s %s; want ADDED a, ADDED b", got[0].typ, got[0].obj.Name, got[1].typ, got[1].obj.Name)
			}
			if err := nextErr(d); !isCleanEnd(err) {
				t.Errorf("after b: %v, want the clean end", err)
			}
			if s := st.layer.Stats(); s.BookmarksDropped != 1 {
				t.Errorf("stats %+v, want 1 bookmark dropped", s)
			}
		})
	}
}

package stream

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
)

// benchConfigMap is a ConfigMap shaped like make bench's (internal/bench's configMap):
// labels, annotations, managed fields and data entries of mixed content, escapes included,
// with as many entries as reach size bytes of JSON.
func benchConfigMap(b *testing.B, size int) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{
			Name: "cm-0042", Namespace: "bench", UID: types.UID("0d8e5d8c-0003-4c1a-9d1b-3f7e0a000003"), ResourceVersion: "1",
			CreationTimestamp: metav1.Unix(1700000000, 0),
			Labels:            map[string]string{"app.kubernetes.io/name": "bench", "app.kubernetes.io/part-of": "watchsan"},
			Annotations: map[string]string{
				"bench.watchsan.io/sent": "wsbts:" + strings.Repeat("0", 19),
				"owner":                  "team-a",
			},
			ManagedFields: []metav1.ManagedFieldsEntry{{
				Manager: "bench-controller", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
				Time: &metav1.Time{Time: metav1.Unix(1700000000, 0).Time}, FieldsType: "FieldsV1",
				FieldsV1: metav1.NewFieldsV1(`{"f:data":{".":{}},"f:metadata":{"f:annotations":{".":{},"f:owner":{}},"f:labels":{".":{},"f:app.kubernetes.io/name":{}}}}`),
			}},
		},
		Data: map[string]string{},
	}
	for i := 0; ; i++ {
		e, err := EncodeEvent(JSON, Modified, cm)
		if err != nil {
			b.Fatal(err)
		}
		if len(e) >= size {
			return cm
		}
		cm.Data[fmt.Sprintf("setting-%03d.conf", i)] = fmt.Sprintf("key-%d = \"value %d\"\nenabled = %t\nlimit = %d\t# tuned\n", i, i*7919%10007, i%2 == 0, i*31)
	}
}

// BenchmarkPassConfigMap is BenchmarkPass over make bench's ConfigMaps.
func BenchmarkPassConfigMap(b *testing.B) {
	for _, f := range formats {
		for _, sz := range benchSizes {
			b.Run(fmt.Sprintf("%s/%s", f, sz.name), func(b *testing.B) {
				cm := benchConfigMap(b, sz.size)
				var evs []testEvent
				for i := range 16 {
					c := cm.DeepCopy()
					c.ResourceVersion = strconv.Itoa(1000 + i)
					evs = append(evs, testEvent{watch.Modified, c})
				}
				stream := apiStream(b, f, evs, false)
				rd, w := NewReader(f, &cycleReader{data: stream}, 0), NewWriter(f, io.Discard)
				b.SetBytes(int64(len(stream) / len(evs)))
				b.ReportAllocs()
				b.ResetTimer()
				defer reportCPU(b, cpuNanos())
				for range b.N {
					ev, err := rd.Next()
					if err != nil {
						b.Fatal(err)
					}
					if err := w.Write(ev); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

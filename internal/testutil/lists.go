package testutil

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	cborserializer "k8s.io/apimachinery/pkg/runtime/serializer/cbor"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
)

// The content types WriteConfigMapList answers in.
const (
	JSON     = "application/json"
	Protobuf = "application/vnd.kubernetes.protobuf"
	CBOR     = "application/cbor"
)

// WriteConfigMapList answers a ConfigMapList at resourceVersion rv, with continue token cont, in
// contentType (JSON, Protobuf or CBOR) as apimachinery encodes it; items are JSON ConfigMaps.
func WriteConfigMapList(w http.ResponseWriter, contentType, rv, cont string, items []string) {
	if contentType == JSON {
		w.Header().Set("Content-Type", JSON)
		fmt.Fprintf(w, `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":%q,"continue":%q},"items":[%s]}`,
			rv, cont, strings.Join(items, ","))
		return
	}
	l := &corev1.ConfigMapList{TypeMeta: metav1.TypeMeta{Kind: "ConfigMapList", APIVersion: "v1"},
		ListMeta: metav1.ListMeta{ResourceVersion: rv, Continue: cont}}
	for _, it := range items {
		var cm corev1.ConfigMap
		if err := json.Unmarshal([]byte(it), &cm); err != nil {
			panic(err)
		}
		l.Items = append(l.Items, cm)
	}
	var enc runtime.Encoder = protobuf.NewSerializer(nil, nil)
	if contentType == CBOR {
		enc = cborserializer.NewSerializer(nil, nil)
	}
	var buf bytes.Buffer
	if err := enc.Encode(l, &buf); err != nil {
		panic(err)
	}
	w.Header().Set("Content-Type", contentType)
	_, _ = w.Write(buf.Bytes())
}

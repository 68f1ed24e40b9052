package stream

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	restclientwatch "k8s.io/client-go/rest/watch"
)

// Per-event cost of what the proxy does to a watch stream, against what a decoding proxy would
// do (decode with apimachinery as client-go does, re-encode as the apiserver does), in the
// same run:
//
//	go test -run '^$' -bench . -benchmem ./internal/stream/
//
// Sizes are the JSON size of the object's event (~1 KiB, ~8 KiB); the protobuf and CBOR events
// of the same Pod are smaller (see the MB/s column, from each format's own size).

// cycleReader plays a stream forever, in reads of at most 32 KiB as a network would give.
type cycleReader struct {
	data []byte
	pos  int
}

func (c *cycleReader) Read(p []byte) (int, error) {
	p = p[:min(len(p), 32<<10)]
	n := 0
	for n < len(p) {
		k := copy(p[n:], c.data[c.pos:])
		n += k
		c.pos = (c.pos + k) % len(c.data)
	}
	return n, nil
}

var benchSizes = []struct {
	name string
	size int
}{{"1KiB", 1024}, {"8KiB", 8192}}

// benchStream is 16 MODIFIED events of one Pod of the given JSON size, with increasing RVs.
func benchStream(b *testing.B, f Format, size int) (stream []byte, perEvent int) {
	p := pod("team-a", "web-0", "0d8e5d8c-0002-4c1a-9d1b-3f7e0a000002", "1", size)
	var evs []testEvent
	for i := range 16 {
		c := p.DeepCopy()
		c.ResourceVersion = strconv.Itoa(1000 + i)
		evs = append(evs, testEvent{watch.Modified, c})
	}
	s := apiStream(b, f, evs, false)
	return s, len(s) / len(evs)
}

func BenchmarkPass(b *testing.B) {
	for _, f := range formats {
		for _, sz := range benchSizes {
			b.Run(fmt.Sprintf("%s/%s", f, sz.name), func(b *testing.B) {
				stream, per := benchStream(b, f, sz.size)
				rd, w := NewReader(f, &cycleReader{data: stream}, 0), NewWriter(f, io.Discard)
				b.SetBytes(int64(per))
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

func BenchmarkRewrite(b *testing.B) {
	for _, f := range formats {
		for _, sz := range benchSizes {
			b.Run(fmt.Sprintf("%s/%s", f, sz.name), func(b *testing.B) {
				stream, per := benchStream(b, f, sz.size)
				rd, w := NewReader(f, &cycleReader{data: stream}, 0), NewWriter(f, io.Discard)
				b.SetBytes(int64(per))
				b.ReportAllocs()
				b.ResetTimer()
				defer reportCPU(b, cpuNanos())
				for range b.N {
					ev, err := rd.Next()
					if err != nil {
						b.Fatal(err)
					}
					if err := w.WriteWithRV(ev, "123456789"); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkDecodeEncode is the baseline: client-go's watch decoding of the same stream, then
// the apiserver's encoding of the decoded event.
func BenchmarkDecodeEncode(b *testing.B) {
	for _, f := range formats {
		for _, sz := range benchSizes {
			b.Run(fmt.Sprintf("%s/%s", f, sz.name), func(b *testing.B) {
				stream, per := benchStream(b, f, sz.size)
				info := serializerInfo(b, f)
				objDecoder := codecs.WithoutConversion().DecoderToVersion(info.Serializer, corev1.SchemeGroupVersion)
				fr := info.StreamSerializer.Framer.NewFrameReader(io.NopCloser(&cycleReader{data: stream}))
				dec := restclientwatch.NewDecoder(streaming.NewDecoder(fr, info.StreamSerializer.Serializer), objDecoder)
				enc := newAPIEncoder(b, f, io.Discard, corev1.SchemeGroupVersion, false)
				b.SetBytes(int64(per))
				b.ReportAllocs()
				b.ResetTimer()
				defer reportCPU(b, cpuNanos())
				for range b.N {
					typ, obj, err := dec.Decode()
					if err != nil {
						b.Fatal(err)
					}
					enc.encode(b, typ, obj)
				}
			})
		}
	}
}

// reportCPU reports the process CPU time per op since start (see cpuNanos).
func reportCPU(b *testing.B, start int64) {
	if start > 0 && b.N > 0 {
		b.ReportMetric(float64(cpuNanos()-start)/float64(b.N), "cpu-ns/op")
	}
}

// TestPassAllocs holds the hot path to its budget: at most one allocation per event passed
// through (the event's strings), none per rewrite beyond it, once buffers are warm.
func TestPassAllocs(t *testing.T) {
	for _, f := range formats {
		var stream bytes.Buffer
		enc := newAPIEncoder(t, f, &stream, corev1.SchemeGroupVersion, false)
		for i := range 16 {
			enc.encode(t, watch.Modified, configMap("ns", "cm", "u", strconv.Itoa(100+i)))
		}
		rd, w := NewReader(f, &cycleReader{data: stream.Bytes()}, 0), NewWriter(f, io.Discard)
		pass := testing.AllocsPerRun(200, func() {
			ev, err := rd.Next()
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Write(ev); err != nil {
				t.Fatal(err)
			}
		})
		rewrite := testing.AllocsPerRun(200, func() {
			ev, err := rd.Next()
			if err != nil {
				t.Fatal(err)
			}
			if err := w.WriteWithRV(ev, "999"); err != nil {
				t.Fatal(err)
			}
		})
		if pass > 1 || rewrite > 1 {
			t.Errorf("%s: %.1f allocations per passed event, %.1f per rewritten one; want at most 1", f, pass, rewrite)
		}
	}
}

// BenchmarkJSONScan is the frame-end scan alone, by path, over the events of BenchmarkPass.
func BenchmarkJSONScan(b *testing.B) {
	for _, sz := range benchSizes {
		stream, per := benchStream(b, JSON, sz.size)
		frame := stream[:bytes.IndexByte(stream, '\n')+1]
		for _, path := range []struct {
			name      string
			bytesOnly bool
		}{{"bytes", true}, {"blocks", false}} {
			b.Run(sz.name+"/"+path.name, func(b *testing.B) {
				s := &jsonScan{record: true, bytesOnly: path.bytesOnly}
				b.SetBytes(int64(per))
				b.ReportAllocs()
				defer reportCPU(b, cpuNanos())
				for range b.N {
					s.reset(0)
					if s.run(frame) != len(frame)-1 {
						b.Fatal("frame end not found")
					}
				}
			})
		}
		b.Run(sz.name+"/line", func(b *testing.B) {
			s := &jsonScan{record: true}
			b.SetBytes(int64(per))
			b.ReportAllocs()
			defer reportCPU(b, cpuNanos())
			for range b.N {
				s.reset(0)
				nl := bytes.IndexByte(frame, '\n')
				if s.runLine(frame[:nl]) != lineOK {
					b.Fatal("line not settled")
				}
			}
		})
	}
}

// eventReader returns at most one event per Read, as an upstream that flushes each event does
// when the watch keeps up: every Read is short, so the Reader goes through its idle buffer
// (and gives its parse state back) between events.
type eventReader struct {
	data []byte
	per  int
	pos  int
}

func (c *eventReader) Read(p []byte) (int, error) {
	n := copy(p[:min(len(p), c.per-c.pos%c.per)], c.data[c.pos:])
	c.pos = (c.pos + n) % len(c.data)
	return n, nil
}

// BenchmarkPassEventReads is BenchmarkPass with one event per Read (eventReader).
func BenchmarkPassEventReads(b *testing.B) {
	for _, f := range formats {
		for _, sz := range benchSizes {
			b.Run(fmt.Sprintf("%s/%s", f, sz.name), func(b *testing.B) {
				stream, per := benchStream(b, f, sz.size)
				if len(stream) != per*16 {
					b.Skip("events of different sizes")
				}
				rd, w := NewReader(f, &eventReader{data: stream, per: per}, 0), NewWriter(f, io.Discard)
				b.SetBytes(int64(per))
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

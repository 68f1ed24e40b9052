package stream

import "testing"

func BenchmarkJSONMasksKernel(b *testing.B) {
	buf := make([]byte, maskBatch*blockSize)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	var out [maskBatch]jsonMasks
	for _, k := range []struct {
		name string
		f    func(*byte, int, *jsonMasks)
	}{{"SSE2", jsonMasksSSE2}, {"AVX2", jsonMasksAVX2}} {
		b.Run(k.name, func(b *testing.B) {
			b.SetBytes(int64(len(buf)))
			defer reportCPU(b, cpuNanos())
			for range b.N {
				k.f(&buf[0], maskBatch, &out[0])
			}
		})
	}
}

package stream

import (
	"testing"

	"golang.org/x/sys/cpu"
)

// TestJSONMasksKernels runs the kernel tests and the scanner's differential tests with each
// amd64 kernel this CPU has.
func TestJSONMasksKernels(t *testing.T) {
	defer func(v bool) { maskKernelAVX2 = v }(maskKernelAVX2)
	for _, avx2 := range []bool{false, true} {
		if avx2 && !cpu.X86.HasAVX2 {
			t.Log("no AVX2 on this CPU")
			continue
		}
		maskKernelAVX2 = avx2
		t.Run(map[bool]string{false: "SSE2", true: "AVX2"}[avx2], func(t *testing.T) {
			TestJSONMasksKernel(t)
			TestJSONScanPathsAgree(t)
		})
	}
}

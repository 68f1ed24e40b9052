package stream

import "golang.org/x/sys/cpu"

// haveMaskKernel: jsonMasksOf runs a kernel, AVX2 where the CPU has it and SSE2 (part of
// every amd64 CPU) otherwise.
const haveMaskKernel = true

// jsonMasksSSE2 and jsonMasksAVX2 write the masks of n consecutive 64-byte blocks at p to
// out[0:n].
//
//go:noescape
func jsonMasksSSE2(p *byte, n int, out *jsonMasks)

//go:noescape
func jsonMasksAVX2(p *byte, n int, out *jsonMasks)

var maskKernelAVX2 = cpu.X86.HasAVX2

// jsonMasksOf fills out with the masks of b's blocks; len(b) is len(out) blocks.
func jsonMasksOf(b []byte, out []jsonMasks) {
	if len(out) == 0 || len(b) < len(out)*blockSize {
		return
	}
	if maskKernelAVX2 {
		jsonMasksAVX2(&b[0], len(out), &out[0])
		return
	}
	jsonMasksSSE2(&b[0], len(out), &out[0])
}

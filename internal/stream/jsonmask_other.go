//go:build !amd64

package stream

// haveMaskKernel: without a kernel the byte loop is faster than masks computed byte by byte.
const haveMaskKernel = false

func jsonMasksOf(b []byte, out []jsonMasks) { jsonMasksGeneric(b, out) }

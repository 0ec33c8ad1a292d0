package allocator

import (
	"math"
	"strconv"
)

// Share is an amount of GPU, in thousandths of one GPU (milli-GPUs): what a
// lease holds of a GPU, what a GPU has free, what a namespace's quota
// allows and uses. Percent requests are whole multiples of it and memory
// requests are rounded up to the next one, so every share the pool
// computes is exact.
//
// The pool counts in Share; people read percent of one GPU (String), as
// bitfusion.io/gpu-percent and requests.bitfusion.io/gpu are written, and
// metrics read GPUs (GPUs).
type Share int64

// WholeGPU is one whole GPU.
const WholeGPU Share = 1000

// SharePercent is p percent of one GPU (100 is one whole GPU), to the
// nearest milli-GPU.
func SharePercent(p float64) Share {
	return Share(math.Round(p * float64(WholeGPU) / 100))
}

// ShareGPUs is n whole GPUs.
func ShareGPUs(n int) Share { return Share(n) * WholeGPU }

// Percent is s in percent of one GPU: 466 milli-GPUs are 46.6.
func (s Share) Percent() float64 { return float64(s) * 100 / float64(WholeGPU) }

// GPUs is s in GPUs: 466 milli-GPUs are 0.466.
func (s Share) GPUs() float64 { return float64(s) / float64(WholeGPU) }

// String prints s in percent of one GPU: "46.6%", "200%".
func (s Share) String() string { return s.FormatPercent() + "%" }

// FormatPercent prints the number of percent alone, without a trailing
// ".0" ("46.6"), where the unit is said elsewhere: a column head, the name
// of a variable.
func (s Share) FormatPercent() string {
	return strconv.FormatFloat(s.Percent(), 'f', -1, 64)
}

// shareOfMemory is the share of a GPU with gpuMemory bytes that bytes of
// it stand for, rounded up to the next milli-GPU so that the share always
// covers the memory; gpuMemory must be positive.
func shareOfMemory(bytes, gpuMemory int64) Share {
	return Share((bytes*int64(WholeGPU) + gpuMemory - 1) / gpuMemory)
}

// ofMemory is the memory that s stands for on a GPU with gpuMemory bytes,
// rounded down, so that the bytes of a whole GPU never exceed it.
func (s Share) ofMemory(gpuMemory int64) int64 {
	return gpuMemory * int64(s) / int64(WholeGPU)
}

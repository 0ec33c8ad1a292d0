package api

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/gpupool/gpupool/allocator"
)

// LeaseEnv is the environment a process using lease l runs with, whoever
// starts it: `gpupool run` for its command, the device plugin for a
// pod's container.
//
// GPUPOOL_LEASE_ID, GPUPOOL_SERVER, GPUPOOL_GPU_UUIDS (comma-separated, in
// the lease's order), GPUPOOL_GPU_PERCENT and GPUPOOL_GPU_MEMORY_BYTES (the
// share of each GPU) say what the lease holds; CUDA_VISIBLE_DEVICES and
// NVIDIA_VISIBLE_DEVICES list its GPUs' UUIDs, for CUDA and for NVIDIA's
// container runtime. A lease of a fraction of each GPU also gets MPS's
// client limits, which take effect where the host runs the MPS control
// daemon and are ignored elsewhere: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, the
// share rounded up to a whole percent, and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT,
// the share's memory on each GPU in MiB, by the GPU's place in
// CUDA_VISIBLE_DEVICES ("0=40960M,1=40960M").
func LeaseEnv(l allocator.Lease) map[string]string {
	uuids := make([]string, len(l.GPUs))
	limits := make([]string, len(l.GPUs))
	var share allocator.Share
	var bytes int64
	for i, g := range l.GPUs {
		uuids[i], share, bytes = g.UUID, g.Share, g.MemoryBytes
		limits[i] = fmt.Sprintf("%d=%dM", i, g.MemoryBytes>>20)
	}
	list := strings.Join(uuids, ",")
	env := map[string]string{
		"GPUPOOL_LEASE_ID": l.ID, "GPUPOOL_SERVER": l.Server, "GPUPOOL_GPU_UUIDS": list,
		"GPUPOOL_GPU_PERCENT":      share.FormatPercent(),
		"GPUPOOL_GPU_MEMORY_BYTES": strconv.FormatInt(bytes, 10),
		"CUDA_VISIBLE_DEVICES":     list, "NVIDIA_VISIBLE_DEVICES": list,
	}
	if share < allocator.WholeGPU {
		env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = strconv.Itoa(int(math.Ceil(share.Percent())))
		env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = strings.Join(limits, ",")
	}
	return env
}

package api

import (
	"maps"
	"testing"

	"github.com/gpupool/gpupool/allocator"
)

// TestLeaseEnv: a process sees its lease's GPUs and share; a fraction
// also gets MPS's limits, by each GPU's place in CUDA_VISIBLE_DEVICES; a
// whole GPU gets none, as MPS would only take threads away from it.
func TestLeaseEnv(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lease allocator.Lease
		want  map[string]string
	}{{
		name: "two whole GPUs",
		lease: allocator.Lease{ID: "lease-000007", Server: "gpu-a", GPUs: []allocator.LeaseGPU{
			{Index: 3, UUID: "GPU-3", Share: allocator.WholeGPU, MemoryBytes: 80 << 30},
			{Index: 1, UUID: "GPU-1", Share: allocator.WholeGPU, MemoryBytes: 80 << 30}}},
		want: map[string]string{
			"GPUPOOL_LEASE_ID": "lease-000007", "GPUPOOL_SERVER": "gpu-a", "GPUPOOL_GPU_UUIDS": "GPU-3,GPU-1",
			"GPUPOOL_GPU_PERCENT": "100", "GPUPOOL_GPU_MEMORY_BYTES": "85899345920",
			"CUDA_VISIBLE_DEVICES": "GPU-3,GPU-1", "NVIDIA_VISIBLE_DEVICES": "GPU-3,GPU-1",
		},
	}, {
		name: "half of each of two GPUs",
		lease: allocator.Lease{ID: "lease-000008", Server: "gpu-a", GPUs: []allocator.LeaseGPU{
			{Index: 0, UUID: "GPU-0", Share: 500, MemoryBytes: 40 << 30},
			{Index: 2, UUID: "GPU-2", Share: 500, MemoryBytes: 40 << 30}}},
		want: map[string]string{
			"GPUPOOL_LEASE_ID": "lease-000008", "GPUPOOL_SERVER": "gpu-a", "GPUPOOL_GPU_UUIDS": "GPU-0,GPU-2",
			"GPUPOOL_GPU_PERCENT": "50", "GPUPOOL_GPU_MEMORY_BYTES": "42949672960",
			"CUDA_VISIBLE_DEVICES": "GPU-0,GPU-2", "NVIDIA_VISIBLE_DEVICES": "GPU-0,GPU-2",
			"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=40960M,1=40960M",
		},
	}, {
		name: "8000 MB of an 80 GiB GPU",
		lease: allocator.Lease{ID: "lease-000009", Server: "gpu-b", GPUs: []allocator.LeaseGPU{
			{Index: 5, UUID: "GPU-5", Share: 94, MemoryBytes: 8_000_000_000}}},
		want: map[string]string{
			"GPUPOOL_LEASE_ID": "lease-000009", "GPUPOOL_SERVER": "gpu-b", "GPUPOOL_GPU_UUIDS": "GPU-5",
			"GPUPOOL_GPU_PERCENT": "9.4", "GPUPOOL_GPU_MEMORY_BYTES": "8000000000",
			"CUDA_VISIBLE_DEVICES": "GPU-5", "NVIDIA_VISIBLE_DEVICES": "GPU-5",
			"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "10", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=7629M",
		},
	}} {
		if got := LeaseEnv(tc.lease); !maps.Equal(got, tc.want) {
			t.Errorf("%s: %v\nwant %v", tc.name, got, tc.want)
		}
	}
}

// Package dra is the pool behind Kubernetes' Dynamic Resource Allocation:
// the DRA spelling of what bitfusion.io/gpu-* asks. Every GPU the pool
// knows is a device of driver gpu.gpupool.io in a ResourceSlice of its
// server (Slices); a ResourceClaim of DeviceClass gpu.gpupool.io asks for
// whole GPUs by count, or a share of each by memory (the devices'
// consumable capacity) or percent (the claim's opaque configuration), the
// model in CEL selectors (RequestOf); the pool's policy places it as it
// places a pod, one lease, and the claim's allocation names exactly the
// lease's GPUs and the memory each gives (Allocation).
package dra

import (
	"strconv"
	"strings"
)

// DriverName is the driver of the pool's devices, and the domain of their
// attributes and capacity.
const DriverName = "gpu.gpupool.io"

// DeviceClassName is the DeviceClass a claim for the pool's GPUs names.
const DeviceClassName = "gpu.gpupool.io"

// The attributes of a device, as CEL selectors read them
// (device.attributes["gpu.gpupool.io"].model == "H100").
const (
	// AttributeModel is the GPU's model, as the pool's servers report it.
	AttributeModel = "model"
	// AttributeIndex is the GPU's index on its server.
	AttributeIndex = "index"
	// AttributeUUID is the GPU's UUID, as CUDA_VISIBLE_DEVICES takes it.
	AttributeUUID = "uuid"
	// AttributeNVLinkGroup is the lowest index of the GPUs the GPU
	// reaches over NVLink, itself included: GPUs of one group share it.
	AttributeNVLinkGroup = "nvlinkGroup"
)

// CapacityMemory is a device's memory in bytes, the capacity a claim
// consumes a share of (capacity.requests.memory); a request that asks for
// none takes it all, a whole GPU.
const CapacityMemory = "memory"

// MinMemory is the least memory a claim may ask of a GPU.
const MinMemory = 1 << 20

// deviceName is the name of the GPU of index i in its server's slice.
func deviceName(i int) string { return "gpu-" + strconv.Itoa(i) }

// deviceIndex is the index of the GPU named name, or false.
func deviceIndex(name string) (int, bool) {
	digits, ok := strings.CutPrefix(name, "gpu-")
	i, err := strconv.Atoi(digits)
	return i, ok && err == nil && i >= 0 && strconv.Itoa(i) == digits
}

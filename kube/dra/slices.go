package dra

import (
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/inventory"
)

// Slices are the pool's devices as DRA publishes them: a slice per GPU
// server with a healthy GPU, named after it (SliceName), a pool of its own
// on the server's node, listing its healthy GPUs, each shareable by
// memory. The servers are the allocator's (GET /v1/pool): the pool's
// inventory is its one source, whether the node is a real one or kwok's.
//
// A slice names its node (spec.nodeName) rather than selecting it:
// kube-scheduler's DRA allocator matches every slice against every node it
// considers, and a node selector is built afresh for each match, which at
// 1,213 nodes took it seconds a pod.
func Slices(servers []api.ServerStatus) []resourceapi.ResourceSlice {
	var out []resourceapi.ResourceSlice
	for _, s := range servers {
		devices := Devices(s)
		if len(devices) == 0 {
			continue
		}
		out = append(out, resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: SliceName(s.Name)},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   DriverName,
				Pool:     resourceapi.ResourcePool{Name: s.Name, ResourceSliceCount: 1},
				NodeName: ptr.To(s.Name),
				Devices:  devices,
			},
		})
	}
	return out
}

// SliceName is the name of the slice of the server's GPUs.
func SliceName(server string) string { return DriverName + "-" + server }

// PlacedByThePool taints every device the pool publishes, so that DRA's
// own allocator (a pod of the default scheduler's, say) never allocates
// one: a share it allocated would hold no lease, and the pool would lease
// it again. The pool writes its allocations itself, which no taint stops.
var PlacedByThePool = resourceapi.DeviceTaint{Key: DriverName + "/placed-by-the-pool", Effect: resourceapi.DeviceTaintEffectNoSchedule}

// Devices are the server's healthy GPUs as DRA devices, by index, each
// tainted PlacedByThePool.
func Devices(s api.ServerStatus) []resourceapi.Device {
	var devices []resourceapi.Device
	for _, g := range s.GPUs {
		if !g.Healthy {
			continue
		}
		memory := *resource.NewQuantity(g.MemoryBytes, resource.BinarySI)
		devices = append(devices, resourceapi.Device{
			Name: deviceName(g.Index),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				AttributeModel:       {StringValue: ptr.To(g.Model)},
				AttributeIndex:       {IntValue: ptr.To(int64(g.Index))},
				AttributeUUID:        {StringValue: ptr.To(g.UUID)},
				AttributeNVLinkGroup: {IntValue: ptr.To(int64(nvlinkGroup(s.GPUs, g)))},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				CapacityMemory: {Value: memory, RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default:    ptr.To(memory),
					ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: resource.NewQuantity(MinMemory, resource.BinarySI)},
				}},
			},
			AllowMultipleAllocations: ptr.To(true),
			Taints:                   []resourceapi.DeviceTaint{PlacedByThePool},
		})
	}
	slices.SortFunc(devices, func(a, b resourceapi.Device) int {
		return int(*a.Attributes[AttributeIndex].IntValue - *b.Attributes[AttributeIndex].IntValue)
	})
	return devices
}

// nvlinkGroup is the lowest index among the GPUs g reaches over NVLink,
// directly or through others, g's own when none.
func nvlinkGroup(gpus []api.GPUStatus, g api.GPUStatus) int {
	byIndex := make(map[int]api.GPUStatus, len(gpus))
	for _, o := range gpus {
		byIndex[o.Index] = o
	}
	lowest, seen, next := g.Index, map[int]bool{g.Index: true}, []api.GPUStatus{g}
	for len(next) > 0 {
		cur := next[0]
		next = next[1:]
		for j, link := range cur.Links {
			o, ok := byIndex[j]
			if !ok || link != inventory.LinkNVLink || seen[j] {
				continue
			}
			seen[j] = true
			lowest = min(lowest, j)
			next = append(next, o)
		}
	}
	return lowest
}

package deviceplugin

import (
	"strconv"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/kube"
)

// replicaSeparator joins a GPU's UUID and the number of one of its
// devices in the percent unit, as NVIDIA's device plugin names the
// replicas of a shared GPU.
const replicaSeparator = "::"

// Devices are the devices of bitfusion.io/gpu that server s, as the pool
// sees it, offers in unit: as many per GPU as units make that GPU, so that
// the node's allocatable counts what the webhook writes into pods. In
// gpus a GPU is one device named by its UUID; in percent it is a hundred,
// "<uuid>::0" to "<uuid>::99"; in a unit of memory, as many as whole
// slices fit in its memory. A GPU is healthy while the pool places leases
// on it: the daemon reports it so and its heartbeats are fresh
// (s.Schedulable); otherwise the kubelet counts its devices out of the
// node's allocatable.
func Devices(unit kube.Unit, s api.ServerStatus) []*pluginapi.Device {
	var devices []*pluginapi.Device
	for _, g := range s.GPUs {
		health := pluginapi.Unhealthy
		if g.Healthy && s.Schedulable {
			health = pluginapi.Healthy
		}
		if unit == kube.UnitGPUs {
			devices = append(devices, &pluginapi.Device{ID: g.UUID, Health: health})
			continue
		}
		for n := range unit.PerGPU(g.MemoryBytes) {
			devices = append(devices, &pluginapi.Device{ID: g.UUID + replicaSeparator + strconv.FormatInt(n, 10), Health: health})
		}
	}
	return devices
}

// gpuOf is the UUID of the GPU a device stands for.
func gpuOf(id string) string {
	uuid, _, _ := strings.Cut(id, replicaSeparator)
	return uuid
}

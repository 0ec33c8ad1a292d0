package dra

import (
	"context"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/inventory"
	"github.com/gpupool/gpupool/kube"
)

const gi = 1 << 30

// server is a server of four GPUs of model, 0-1 and 2-3 linked by NVLink,
// GPU 3 unhealthy.
func server(name, model string, memory int64) api.ServerStatus {
	s := api.ServerStatus{Name: name}
	for i := range 4 {
		links := make([]inventory.Link, 4)
		links[i^1] = inventory.LinkNVLink
		s.GPUs = append(s.GPUs, api.GPUStatus{Index: i, UUID: "GPU-" + name + "-" + deviceName(i), Model: model, MemoryBytes: memory, Healthy: i != 3, Links: links})
	}
	return s
}

// TestSlicesPublishEachServersHealthyGPUs: a slice per server, on its
// node by name, its own pool, a device per healthy GPU with its model,
// index, UUID and NVLink group, shareable by memory, a request for none
// taking it all, tainted against DRA's own allocator.
func TestSlicesPublishEachServersHealthyGPUs(t *testing.T) {
	down := server("gpu-down", "A100", 40*gi)
	for i := range down.GPUs {
		down.GPUs[i].Healthy = false
	}
	slices := Slices([]api.ServerStatus{server("gpu-0", "H100", 80*gi), down})
	if len(slices) != 1 {
		t.Fatalf("slices %+v, want gpu-0's alone (gpu-down has no healthy GPU)", slices)
	}
	s := slices[0]
	if s.Name != "gpu.gpupool.io-gpu-0" || s.Spec.Driver != DriverName || ptr.Deref(s.Spec.NodeName, "") != "gpu-0" || s.Spec.NodeSelector != nil ||
		s.Spec.Pool != (resourceapi.ResourcePool{Name: "gpu-0", ResourceSliceCount: 1}) {
		t.Errorf("slice %s: driver %s, node %v, selector %v, pool %+v; want gpu-0's own pool, on node gpu-0 by name", s.Name, s.Spec.Driver, s.Spec.NodeName, s.Spec.NodeSelector, s.Spec.Pool)
	}
	devices := s.Spec.Devices
	if len(devices) != 3 {
		t.Fatalf("%d devices, want the 3 healthy GPUs", len(devices))
	}
	for i, d := range devices {
		attr := d.Attributes
		if d.Name != deviceName(i) || *attr[AttributeModel].StringValue != "H100" || *attr[AttributeIndex].IntValue != int64(i) ||
			*attr[AttributeUUID].StringValue != "GPU-gpu-0-gpu-"+deviceName(i)[4:] || *attr[AttributeNVLinkGroup].IntValue != int64(i&^1) {
			t.Errorf("device %d: %s %+v", i, d.Name, attr)
		}
		memory := d.Capacity[CapacityMemory]
		if len(d.Taints) != 1 || d.Taints[0] != PlacedByThePool {
			t.Errorf("device %d: taints %+v, want %+v alone", i, d.Taints, PlacedByThePool)
		}
		if memory.Value.Value() != 80*gi || memory.RequestPolicy.Default.Value() != 80*gi || memory.RequestPolicy.ValidRange.Min.Value() != MinMemory || !ptr.Deref(d.AllowMultipleAllocations, false) {
			t.Errorf("device %d: capacity %+v, shared %v", i, memory, d.AllowMultipleAllocations)
		}
	}
}

// claim is a claim of one request, for count GPUs of the pool's class,
// with selectors.
func claim(count int64, memory string, selectors ...string) *resourceapi.ResourceClaim {
	x := &resourceapi.ExactDeviceRequest{DeviceClassName: DeviceClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}
	if memory != "" {
		x.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{CapacityMemory: resource.MustParse(memory)}}
	}
	for _, s := range selectors {
		x.Selectors = append(x.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: s}})
	}
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "gpu", Namespace: "ml"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: x}}}}}
}

func withPercent(c *resourceapi.ResourceClaim, parameters string) *resourceapi.ResourceClaim {
	c.Spec.Devices.Config = append(c.Spec.Devices.Config, resourceapi.DeviceClaimConfiguration{DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: DriverName, Parameters: runtime.RawExtension{Raw: []byte(parameters)}}}})
	return c
}

var catalog = Catalog{"H100": 80 * gi, "L40S": 48 * gi}

// TestReadClaim: a claim's one request as the pool's request: whole GPUs
// by count, a share by memory or percent, the models its selectors match,
// NVLink between its GPUs.
func TestReadClaim(t *testing.T) {
	nvlinked := claim(2, "")
	nvlinked.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{MatchAttribute: ptr.To(resourceapi.FullyQualifiedName(DriverName + "/" + AttributeNVLinkGroup))}}
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  kube.Request
	}{
		{"two whole GPUs", claim(2, ""), kube.Request{GPUAmount: 2}},
		{"8Gi of one", claim(1, "8Gi"), kube.Request{GPUAmount: 1, GPUMemory: "8589934592"}},
		{"half of one", withPercent(claim(1, ""), `{"percent": 50}`), kube.Request{GPUAmount: 1, GPUPercent: 50}},
		{"an H100", claim(1, "", `device.attributes["gpu.gpupool.io"].model == "H100"`), kube.Request{GPUAmount: 1, Models: []string{"H100"}}},
		{"by memory", claim(1, "", `device.capacity["gpu.gpupool.io"].memory.compareTo(quantity("60Gi")) >= 0`), kube.Request{GPUAmount: 1, Models: []string{"H100"}}},
		{"two selectors", claim(1, "", `device.attributes["gpu.gpupool.io"].model != "A100"`, `device.driver == "gpu.gpupool.io"`), kube.Request{GPUAmount: 1, Models: []string{"H100", "L40S"}}},
		{"NVLinked", nvlinked, kube.Request{GPUAmount: 2, Topology: "nvlink"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ours, err := ReadClaim(context.Background(), tc.claim, catalog)
			if err != nil || !ours || got.Name != "gpu" || got.Request.Annotation() != tc.want.Annotation() {
				t.Errorf("ReadClaim: %+v, ours %v, %v; want %+v", got, ours, err, tc.want)
			}
		})
	}
	other := claim(1, "")
	other.Spec.Devices.Requests[0].Exactly.DeviceClassName = "gpu.nvidia.com"
	if _, ours, err := ReadClaim(context.Background(), other, catalog); ours || err != nil {
		t.Errorf("a claim of gpu.nvidia.com: ours %v, %v; want DRA's own", ours, err)
	}
}

// TestReadClaimRefuses: a claim the pool cannot place as asked is refused
// naming the field, the value and the limit.
func TestReadClaimRefuses(t *testing.T) {
	all := claim(1, "")
	all.Spec.Devices.Requests[0].Exactly.AllocationMode = resourceapi.DeviceAllocationModeAll
	alternatives := claim(1, "")
	alternatives.Spec.Devices.Requests[0] = resourceapi.DeviceRequest{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{{Name: "big", DeviceClassName: DeviceClassName}}}
	two := claim(1, "")
	two.Spec.Devices.Requests = append(two.Spec.Devices.Requests, resourceapi.DeviceRequest{Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "nic.example.com"}})
	admin := claim(1, "")
	admin.Spec.Devices.Requests[0].Exactly.AdminAccess = ptr.To(true)
	otherCapacity := claim(1, "")
	otherCapacity.Spec.Devices.Requests[0].Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"cores": resource.MustParse("8")}}
	uuidConstraint := claim(2, "")
	uuidConstraint.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{MatchAttribute: ptr.To(resourceapi.FullyQualifiedName(DriverName + "/" + AttributeUUID))}}
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  string
	}{
		{"no GPU", claim(0, ""), `spec.devices.requests[0].exactly.count: Invalid value: 0: must be 1..`},
		{"too many GPUs", claim(1000, ""), `spec.devices.requests[0].exactly.count: Invalid value: 1000: must be 1..`},
		{"no memory", claim(1, "0"), `spec.devices.requests[0].exactly.capacity.requests[memory]: Invalid value: "0": must be 1Mi..80Gi`},
		{"more memory than a GPU has", claim(1, "81Gi"), `capacity.requests[memory]: Invalid value: "81Gi": must be 1Mi..80Gi`},
		{"more memory than the model has", claim(1, "60Gi", `device.attributes["gpu.gpupool.io"].model == "L40S"`), `Invalid value: "60Gi": must be 1Mi..48Gi`},
		{"an unknown model", claim(1, "", `device.attributes["gpu.gpupool.io"].model == "B200"`), `spec.devices.requests[0].exactly.selectors: Invalid value: "[\"device.attributes[\\\"gpu.gpupool.io\\\"].model == \\\"B200\\\"\"]": no GPU model of the pool matches (it has [H100 L40S])`},
		{"a selector by UUID", claim(1, "", `device.attributes["gpu.gpupool.io"].uuid == "GPU-1"`), `spec.devices.requests[0].exactly.selectors[0].cel.expression: Invalid value: "device.attributes[\"gpu.gpupool.io\"].uuid == \"GPU-1\"": the pool places by a GPU's model and memory only`},
		{"a selector that does not compile", claim(1, "", `device.attributes[`), `spec.devices.requests[0].exactly.selectors[0].cel.expression: Invalid value:`},
		{"percent 0", withPercent(claim(1, ""), `{"percent": 0}`), `spec.devices.config[0].opaque.parameters.percent: Invalid value: 0: must be 1..100`},
		{"percent 101", withPercent(claim(1, ""), `{"percent": 101}`), `spec.devices.config[0].opaque.parameters.percent: Invalid value: 101: must be 1..100`},
		{"an unknown parameter", withPercent(claim(1, ""), `{"percentage": 50}`), `spec.devices.config[0].opaque.parameters: Invalid value: "{\"percentage\": 50}": want {"percent": 1..100}: json: unknown field "percentage"`},
		{"percent and memory", withPercent(claim(1, "8Gi"), `{"percent": 50}`), `capacity.requests[memory]: Invalid value: "8589934592": a share is by memory or by percent`},
		{"all devices", all, `spec.devices.requests[0].exactly.allocationMode: Unsupported value: "All": supported values: "ExactCount"`},
		{"alternatives", alternatives, `spec.devices.requests[0].firstAvailable: Forbidden: the pool places one request`},
		{"two requests", two, `spec.devices.requests: Invalid value: 2: a claim for gpu.gpupool.io devices has one request`},
		{"admin access", admin, `spec.devices.requests[0].exactly.adminAccess: Forbidden`},
		{"another capacity", otherCapacity, `spec.devices.requests[0].exactly.capacity.requests[cores]: Unsupported value: "cores": supported values: "memory"`},
		{"another constraint", uuidConstraint, `spec.devices.constraints[0].matchAttribute: Unsupported value: "gpu.gpupool.io/uuid": supported values: "gpu.gpupool.io/nvlinkGroup"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ours, err := ReadClaim(context.Background(), tc.claim, catalog)
			if err == nil || !ours || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ReadClaim: %+v, ours %v, %v; want it refused with %q", got, ours, err, tc.want)
			}
		})
	}
}

// TestAllocationNamesTheLeasesGPUs: a result per GPU of the lease, its
// device in the server's pool, the memory it gives and a share ID that is
// the same for the same lease and GPU, on the lease's node; Allocated
// reads it back.
func TestAllocationNamesTheLeasesGPUs(t *testing.T) {
	l := api.Lease{ID: "lease-000007", Server: "gpu-0", GPUs: []api.LeaseGPU{{Index: 1, MemoryBytes: 8 * gi}, {Index: 2, MemoryBytes: 8 * gi}}}
	a := Allocation("gpu", l)
	if len(a.Devices.Results) != 2 || a.NodeSelector.NodeSelectorTerms[0].MatchFields[0].Values[0] != "gpu-0" {
		t.Fatalf("allocation %+v", a)
	}
	for i, r := range a.Devices.Results {
		memory := r.ConsumedCapacity[CapacityMemory]
		if r.Request != "gpu" || r.Driver != DriverName || r.Pool != "gpu-0" || r.Device != deviceName(l.GPUs[i].Index) || memory.Value() != 8*gi || r.ShareID == nil || len(*r.ShareID) != 36 {
			t.Errorf("result %d: %+v", i, r)
		}
	}
	if again := Allocation("gpu", l); *again.Devices.Results[0].ShareID != *a.Devices.Results[0].ShareID || *a.Devices.Results[0].ShareID == *a.Devices.Results[1].ShareID {
		t.Errorf("share IDs %s, %s, again %s: want one per GPU, the same again", *a.Devices.Results[0].ShareID, *a.Devices.Results[1].ShareID, *again.Devices.Results[0].ShareID)
	}
	if server, indexes, err := Allocated(a); err != nil || server != "gpu-0" || len(indexes) != 2 || indexes[0] != 1 || indexes[1] != 2 {
		t.Errorf("Allocated: %s %v %v", server, indexes, err)
	}
}

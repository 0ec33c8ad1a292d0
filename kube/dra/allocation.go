package dra

import (
	"fmt"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpupool/gpupool/allocator/api"
)

// shareIDSpace makes a lease's share IDs: the same lease and GPU give the
// same ID, so that writing an allocation again is writing the same one.
var shareIDSpace = uuid.MustParse("4f6e0c52-8a4b-4a3e-9f2d-6b1c0d7e5a91")

// Allocation is a claim's allocation of the lease: one result per GPU of
// the lease, for the claim's request, naming the GPU's device in its
// server's pool, the memory it gives, and a share ID of its own (DRA's
// allocator counts a result without one as the whole device), on the
// lease's server alone.
func Allocation(request string, l api.Lease) *resourceapi.AllocationResult {
	a := &resourceapi.AllocationResult{NodeSelector: nodeSelector(l.Server)}
	for _, g := range l.GPUs {
		share := types.UID(uuid.NewSHA1(shareIDSpace, fmt.Appendf(nil, "%s/%d", l.ID, g.Index)).String())
		a.Devices.Results = append(a.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: request, Driver: DriverName, Pool: l.Server, Device: deviceName(g.Index), ShareID: &share,
			ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{CapacityMemory: *resource.NewQuantity(g.MemoryBytes, resource.BinarySI)},
		})
	}
	return a
}

// Allocated are the GPUs, by server and index, that an allocation names
// of the pool's devices; none for an allocation of others'.
func Allocated(a *resourceapi.AllocationResult) (server string, indexes []int, err error) {
	if a == nil {
		return "", nil, nil
	}
	for _, r := range a.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		i, ok := deviceIndex(r.Device)
		switch {
		case !ok:
			return "", nil, fmt.Errorf("device %q of pool %q is none of %s's", r.Device, r.Pool, DriverName)
		case server != "" && r.Pool != server:
			return "", nil, fmt.Errorf("devices of two servers, %s and %s", server, r.Pool)
		}
		server = r.Pool
		indexes = append(indexes, i)
	}
	return server, indexes, nil
}

// AllocatesLease reports whether a names the lease's GPUs, no others.
func AllocatesLease(a *resourceapi.AllocationResult, l api.Lease) bool {
	server, indexes, err := Allocated(a)
	if err != nil || server != l.Server || len(indexes) != len(l.GPUs) {
		return false
	}
	for i, g := range l.GPUs {
		if indexes[i] != g.Index {
			return false
		}
	}
	return true
}

// nodeSelector selects the node of the name: where an allocation's
// devices are, which kube-scheduler and the kubelet read.
func nodeSelector(node string) *corev1.NodeSelector {
	return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
	}}}
}

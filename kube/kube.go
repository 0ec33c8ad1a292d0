// Package kube is the contract between gpupool's Kubernetes components and
// the YAML users write: the bitfusion.io resource names and BFK's
// annotations they accept, the unit of bitfusion.io/gpu (one cluster
// setting), and the annotations gpupool itself writes on a pod on its way
// from admission (kube/admission) through placement (kube/scheduler) and
// its node's device plugin (kube/deviceplugin) to the end of its lease
// (kube/leases).
package kube

import (
	"encoding/json"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpupool/gpupool/allocator"
)

// Resource names users write in a container's resources.
const (
	// ResourceGPU is what the webhook normalises every request into, in the
	// cluster's Unit, so that a ResourceQuota on requests.bitfusion.io/gpu
	// counts it.
	ResourceGPU = "bitfusion.io/gpu"
	// ResourceGPUAmount, ResourceGPUPercent and ResourceGPUMemory are BFK's
	// request: GPUs per pod, the share of each (1..100), or GPU memory.
	ResourceGPUAmount  = "bitfusion.io/gpu-amount"
	ResourceGPUPercent = "bitfusion.io/gpu-percent"
	ResourceGPUMemory  = "bitfusion.io/gpu-memory"
	// ResourcePrefix is the prefix of every name above; any other name
	// under it is refused.
	ResourcePrefix = "bitfusion.io/"
)

// BFK's pod annotations, accepted as users wrote them for BFK.
const (
	// AnnotationAutoManagement is "all" (or y, yes, true, on), "injection"
	// or "none": whether BFK wrapped the command in its client. gpupool
	// places the pod on the server that holds its lease, so no client is
	// injected whatever the value; the value is checked and kept.
	AnnotationAutoManagement = "auto-management/bitfusion"
	// AnnotationStatus is set to StatusInjected once the webhook has
	// handled the pod, as BFK did; the webhook leaves a pod so marked alone.
	AnnotationStatus = "auto-management/status"
	StatusInjected   = "injected"
	// AnnotationClientOS and AnnotationClientVersion chose BFK's client
	// build; gpupool keeps them for the record.
	AnnotationClientOS      = "bitfusion-client/os"
	AnnotationClientVersion = "bitfusion-client/version"
)

// gpupool's own annotations.
const (
	// AnnotationModels restricts placement to GPU models ("A100,H100").
	AnnotationModels = "gpupool.io/gpu-models"
	// AnnotationTopology is the least link between each pair of the pod's
	// GPUs: any (the default), socket, pcie-switch or nvlink.
	AnnotationTopology = "gpupool.io/topology"
	// AnnotationRequest is the whole request the webhook read, as JSON
	// (Request): what the scheduler asks the pool for.
	AnnotationRequest = "gpupool.io/request"
	// AnnotationLease and AnnotationGPUs are written when the pod is bound:
	// its lease's ID and the GPUs it holds on the node, for the node side.
	AnnotationLease = "gpupool.io/lease"
	AnnotationGPUs  = "gpupool.io/gpus"
	// AnnotationAllocated is written by the device plugin when the kubelet
	// allocates the pod's GPU container: a digest of the device IDs the
	// kubelet gave it. The plugin never hands a pod so marked a lease again,
	// and checks by it, before the container starts, that the pod the
	// kubelet gave those devices to is the one whose lease it answered.
	AnnotationAllocated = "gpupool.io/allocated"
	// AnnotationIdleReplicas is written by the lease controller on a
	// Deployment or StatefulSet it scaled to zero under its namespace's
	// idle policy: the replicas it had, which resuming restores.
	AnnotationIdleReplicas = "gpupool.io/idle-replicas"
	// AnnotationIdleSuspended is written by the lease controller on a Job
	// it suspended under its namespace's idle policy, when: resuming
	// resumes only a Job it suspended (not one Kueue holds).
	AnnotationIdleSuspended = "gpupool.io/idle-suspended"
	// AnnotationIdleExempt on a pod or its workload (Job, Deployment,
	// StatefulSet, ReplicaSet) exempts it from its namespace's idle
	// reclaim; its value says why. Only the platform team may set it: the
	// ValidatingAdmissionPolicy gpupool-idle-exemptions refuses it to
	// anyone without the verb grant on idleexemptions.gpupool.io.
	AnnotationIdleExempt = "gpupool.io/idle-exempt"
)

// SimulatedDeviceDir is where a container finds the simulated GPUs its pod
// was given, on a node without GPUs whose gpupool-server simulates them
// with device files (--simulated-device-dir): each GPU's file, named by
// its UUID, is mounted at SimulatedDeviceDir/<UUID>, and a process that
// holds it open is on that GPU for the daemon, as a CUDA process holding
// /dev/nvidiaN is. The files carry no data: they stand for the GPUs in
// tests and demos only.
const SimulatedDeviceDir = "/dev/gpupool"

// SchedulerName is the kube-scheduler profile that places pods through the
// pool (its extender acquires their leases); the webhook writes it into
// the spec.schedulerName of each pod it normalises.
const SchedulerName = "gpupool-scheduler"

// Unit is what one unit of bitfusion.io/gpu stands for: a cluster setting,
// the same for the webhook (which writes it), the controller (which reads
// ResourceQuotas in it) and the device plugin (which counts nodes in it).
type Unit string

const (
	// UnitPercent is BFK's unit: 100 is one whole GPU, so a quota of
	// requests.bitfusion.io/gpu: 100 is one GPU's worth. The default.
	UnitPercent Unit = "percent"
	// UnitGPUs is the unit of the Bitfusion-on-Kubernetes articles:
	// bitfusion.io/gpu: 2 is two whole GPUs.
	UnitGPUs Unit = "gpus"
	// unitMemoryPrefix starts a unit of GPU memory, "memory:8Gi": the
	// articles' values (memoryPerUnit: 8Gi, a node's GPUs cut into slices
	// of it), where bitfusion.io/gpu: 2 is 16Gi of one GPU's memory.
	unitMemoryPrefix = "memory:"
)

// Units lists the named units, the default first; a unit of memory
// (MemoryUnit) is any size.
var Units = []Unit{UnitPercent, UnitGPUs}

// MemoryUnit is the unit of bytes of GPU memory.
func MemoryUnit(bytes int64) Unit {
	return Unit(unitMemoryPrefix + resource.NewQuantity(bytes, resource.BinarySI).String())
}

// ParseUnit reads a unit's name.
func ParseUnit(s string) (Unit, error) {
	if size, ok := strings.CutPrefix(s, unitMemoryPrefix); ok {
		q, err := resource.ParseQuantity(size)
		most := resource.NewQuantity(allocator.MaxGPUMemoryBytes, resource.BinarySI)
		if err != nil || q.Cmp(*most) > 0 || q.Cmp(*resource.NewQuantity(1<<20, resource.BinarySI)) < 0 {
			return "", fmt.Errorf("unit %q: %q must be a quantity of GPU memory from 1Mi to %s, such as memory:8Gi", s, size, most)
		}
		// Whole bytes: a unit rounded silently would count every pod's
		// slices against a size other than the one configured.
		if q.Cmp(*resource.NewQuantity(q.Value(), q.Format)) != 0 {
			return "", fmt.Errorf("unit %q: %q must be a quantity of GPU memory in whole bytes, such as memory:8Gi", s, size)
		}
		return Unit(s), nil
	}
	for _, u := range Units {
		if string(u) == s {
			return u, nil
		}
	}
	return "", fmt.Errorf("unit %q: must be one of %s", s, strings.Join(unitNames(), ", "))
}

func unitNames() []string {
	names := make([]string, 0, len(Units)+1)
	for _, u := range Units {
		names = append(names, string(u))
	}
	return append(names, unitMemoryPrefix+"<size>")
}

// MemoryBytes is the GPU memory one unit stands for; 0 unless u is a unit
// of memory.
func (u Unit) MemoryBytes() int64 {
	size, ok := strings.CutPrefix(string(u), unitMemoryPrefix)
	if !ok {
		return 0
	}
	q, err := resource.ParseQuantity(size)
	if err != nil {
		return 0
	}
	return q.Value()
}

// PerGPU is how many units one GPU of gpuMemory bytes holds: 100 in
// percent, 1 in gpus, as many whole slices as fit in a unit of memory.
func (u Unit) PerGPU(gpuMemory int64) int64 {
	switch {
	case u == UnitGPUs:
		return 1
	case u.MemoryBytes() > 0:
		return gpuMemory / u.MemoryBytes()
	}
	return 100
}

// Share is the GPU share n units stand for, on a GPU of gpuMemory bytes
// (which only a unit of memory depends on): what a ResourceQuota of n
// allows. Rounded down, so that a quota never allows more than it says.
func (u Unit) Share(n, gpuMemory int64) allocator.Share {
	if m := u.MemoryBytes(); m > 0 {
		if gpuMemory <= 0 {
			return 0
		}
		// n x m may pass 2^63 for an absurd quota: in floats, then capped.
		share := float64(n) * float64(m) / float64(gpuMemory) * float64(allocator.WholeGPU)
		return allocator.Share(min(share, float64(allocator.WholeGPU)*float64(1<<40)))
	}
	if u == UnitGPUs {
		return allocator.Share(n) * allocator.WholeGPU
	}
	return allocator.Share(n) * allocator.WholeGPU / 100
}

// Request is what a pod asks of the pool, as the webhook records it in
// AnnotationRequest: BFK's fields, in the allocator's wire vocabulary.
type Request struct {
	// GPUAmount is how many GPUs, all on one server.
	GPUAmount int `json:"gpuAmount"`
	// GPUPercent is the share of each GPU (1..100); GPUMemory, instead,
	// GPU memory per GPU ("8000M"). Neither means whole GPUs.
	GPUPercent int    `json:"gpuPercent,omitempty"`
	GPUMemory  string `json:"gpuMemory,omitempty"`
	// Models restricts placement to these GPU models.
	Models []string `json:"models,omitempty"`
	// Topology is the least link between each pair of the GPUs.
	Topology string `json:"topology,omitempty"`
}

// RequestOf reads a pod's AnnotationRequest.
func RequestOf(annotations map[string]string) (Request, bool, error) {
	v, ok := annotations[AnnotationRequest]
	if !ok {
		return Request{}, false, nil
	}
	var r Request
	if err := json.Unmarshal([]byte(v), &r); err != nil {
		return Request{}, true, fmt.Errorf("annotation %s: %w", AnnotationRequest, err)
	}
	return r, true, nil
}

// Annotation is r as AnnotationRequest's value.
func (r Request) Annotation() string {
	b, err := json.Marshal(r)
	if err != nil {
		panic(err) // plain fields: cannot fail
	}
	return string(b)
}

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
// the same for the webhook (which writes it) and the controller (which
// reads ResourceQuotas in it).
type Unit string

const (
	// UnitPercent is BFK's unit: 100 is one whole GPU, so a quota of
	// requests.bitfusion.io/gpu: 100 is one GPU's worth. The default.
	UnitPercent Unit = "percent"
	// UnitGPUs is the unit of the Bitfusion-on-Kubernetes articles:
	// bitfusion.io/gpu: 2 is two whole GPUs.
	UnitGPUs Unit = "gpus"
)

// Units lists the units a flag accepts, the default first.
var Units = []Unit{UnitPercent, UnitGPUs}

// ParseUnit reads a unit's name.
func ParseUnit(s string) (Unit, error) {
	for _, u := range Units {
		if string(u) == s {
			return u, nil
		}
	}
	return "", fmt.Errorf("unit %q: must be one of %s", s, strings.Join(unitNames(), ", "))
}

func unitNames() []string {
	names := make([]string, len(Units))
	for i, u := range Units {
		names[i] = string(u)
	}
	return names
}

// Share is the GPU share n units of bitfusion.io/gpu stand for.
func (u Unit) Share(n int64) allocator.Share {
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

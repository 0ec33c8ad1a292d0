package kube

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/gpupool/gpupool/allocator/api"
)

// LeaseRequest is the lease a pod the pool places holds: what its
// AnnotationRequest asks, with the CPU and memory kube-scheduler counts
// for it, the pod as owner, and the pod's UID as idempotency key, so that
// every acquisition for the pod (the scheduler's filter and bind, the
// lease controller's after a lease was lost) returns its one lease. The
// lease lives until released: the lease controller ends it with the pod.
// servers restricts placement to those nodes.
func LeaseRequest(pod *corev1.Pod, servers []string) (api.AcquireRequest, error) {
	r, ok, err := RequestOf(pod.Annotations)
	if err != nil {
		return api.AcquireRequest{}, err
	}
	if !ok {
		return api.AcquireRequest{}, fmt.Errorf("pod %s/%s has no annotation %s", pod.Namespace, pod.Name, AnnotationRequest)
	}
	return LeaseRequestFor(pod, r, servers), nil
}

// LeaseRequestFor is pod's lease of r among servers: r's GPUs, the pod's
// CPU and memory as kube-scheduler counts them, the pod as owner and its
// UID as the idempotency key, until released.
func LeaseRequestFor(pod *corev1.Pod, r Request, servers []string) api.AcquireRequest {
	requests := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	return api.AcquireRequest{
		Namespace: pod.Namespace, GPUAmount: r.GPUAmount, GPUPercent: r.GPUPercent, GPUMemory: r.GPUMemory, Models: r.Models,
		Topology: r.Topology, CPU: quantity(requests, corev1.ResourceCPU), Memory: quantity(requests, corev1.ResourceMemory),
		Owner:          api.Owner{Pod: pod.Name, UID: string(pod.UID), Labels: pod.Labels},
		IdempotencyKey: string(pod.UID), Servers: servers, UntilReleased: true,
	}
}

// quantity is a request as the allocator reads it; "" for none.
func quantity(requests corev1.ResourceList, name corev1.ResourceName) string {
	if q, ok := requests[name]; ok && !q.IsZero() {
		return q.String()
	}
	return ""
}

// LeaseAnnotations are the annotations that tell the node side which
// lease a pod holds and its GPUs there: AnnotationLease, the lease's ID,
// and AnnotationGPUs, the GPUs' UUIDs, comma-separated in the lease's
// order (as CUDA_VISIBLE_DEVICES lists them).
func LeaseAnnotations(l *api.Lease) map[string]string {
	uuids := make([]string, len(l.GPUs))
	for i, g := range l.GPUs {
		uuids[i] = g.UUID
	}
	return map[string]string{AnnotationLease: l.ID, AnnotationGPUs: strings.Join(uuids, ",")}
}

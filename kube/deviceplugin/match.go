package deviceplugin

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpupool/gpupool/kube"
)

// The kubelet's Allocate names devices, never the pod they are for; the
// plugin finds the pod the way the kubelet chose it. The kubelet admits
// pods one at a time, each as its watch delivers it bound to the node
// (the pods it finds when it starts, in creation order), and calls
// Allocate while admitting, before the pod's resources are checked. The
// plugin's own watch of the node's pods delivers bindings in the same
// order, so the pod the kubelet allocates for is the first of those bound
// and not yet allocated whose GPU container asks for as many devices.

// A waiting pod is bound to the node with a lease and not yet allocated,
// with the place the kubelet admits it in.
type waiting struct {
	pod *corev1.Pod
	// arrival orders the pods the plugin's watch saw bound: 0 for those
	// already bound when the kubelet last started (or the plugin, which
	// cannot tell the order of those), then 1, 2, ... as they come.
	arrival uint64
}

// awaitsDevices reports whether the kubelet may still allocate pod's GPU
// container on node: the pod is bound there with a lease, not marked
// allocated, and not yet ended (the kubelet fails the pods it rejects).
func awaitsDevices(pod *corev1.Pod, node string) bool {
	_, leased := pod.Annotations[kube.AnnotationLease]
	_, allocated := pod.Annotations[kube.AnnotationAllocated]
	ended := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
	return pod.Spec.NodeName == node && leased && !allocated && !ended
}

// gpuDevices is how many bitfusion.io/gpu the pod's GPU container asks
// for, in its limits, which the kubelet allocates by; 0 when none asks.
// The webhook lets one container of a pod ask.
func gpuDevices(pod *corev1.Pod) int64 {
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		if q, ok := c.Resources.Limits[kube.ResourceGPU]; ok {
			return q.Value()
		}
	}
	return 0
}

// next is the pod the kubelet allocates size devices for: the first in
// the kubelet's order among the waiting pods that ask for size.
func next(pods []waiting, size int) (*corev1.Pod, bool) {
	pods = slices.DeleteFunc(slices.Clone(pods), func(w waiting) bool { return gpuDevices(w.pod) != int64(size) })
	if len(pods) == 0 {
		return nil, false
	}
	return slices.MinFunc(pods, func(a, b waiting) int {
		return cmp.Or(cmp.Compare(a.arrival, b.arrival),
			a.pod.CreationTimestamp.Compare(b.pod.CreationTimestamp.Time),
			cmp.Compare(a.pod.Namespace, b.pod.Namespace), cmp.Compare(a.pod.Name, b.pod.Name))
	}).pod, true
}

// devicesDigest names a set of device IDs in AnnotationAllocated: a
// percent lease of several GPUs has hundreds of them.
func devicesDigest(ids []string) string {
	sum := sha256.Sum256([]byte(strings.Join(slices.Sorted(slices.Values(ids)), ",")))
	return hex.EncodeToString(sum[:8])
}

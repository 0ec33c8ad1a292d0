// Package admission is gpupool's admission webhook for pods. It accepts the
// YAML users wrote for Bitfusion on Kubernetes (BFK) and for the
// Bitfusion-on-Kubernetes articles unchanged, and turns each pod's GPU
// request into the one resource the cluster counts: bitfusion.io/gpu in the
// cluster's unit, in requests and limits, so that a ResourceQuota on
// requests.bitfusion.io/gpu counts it and the pool's scheduler places it.
//
// Mutate computes a created pod's JSON patch, or refuses the pod when its
// request cannot be normalised, when it arrives already bound to a node
// (spec.nodeName), or when it arrives already marked as handled and its
// recorded request does not match its bitfusion.io/gpu. It
// is a pure function of the pod; NewHandler serves it as AdmissionReview
// v1. That an update never changes a handled pod's request is checked in
// kube-apiserver itself (the gpupool-pod-annotations policy), so that no
// update of a pod waits on the webhook.
//
// Choices, and why:
//
//   - One container per pod asks for GPUs (an init container may be that
//     one). The pool leases once per pod, and two containers' requests
//     (1 GPU at 50% and 2 at 30%) have no single lease that is both; with
//     one asking container, the quota's count of the pod (the sum over
//     containers, or the largest init container) is that container's
//     bitfusion.io/gpu, the lease's share.
//   - In the gpus unit a fraction of a GPU (gpu-percent below 100, or any
//     gpu-memory) is refused, not rounded up: the quota would count whole
//     GPUs while the pool's ledger counts the fraction, and the two would
//     disagree on every such pod.
//   - A gpu-memory without a unit is megabytes, as BFK read it. Kubernetes
//     stores the number 8000 as "8k", so the written form is lost by the
//     time a webhook sees it: any value below 10^6 is read as megabytes (a
//     GPU of 10^6 MB does not exist), larger ones as bytes ("8000M", "16Gi").
//   - auto-management/bitfusion is checked and kept, whatever its value:
//     a pod runs on the GPU server that holds its lease, so there is no
//     client to inject and no command to wrap.
package admission

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/gpupool/gpupool/kube"
)

// DefaultGPUMemory is BFK's TOTAL_GPU_MEMORY, 16000 MB: with it, YAML
// written for BFK asks the same bitfusion.io/gpu as it did there. Set
// Config.GPUMemoryBytes to the pool's GPUs' memory instead when they differ.
const DefaultGPUMemory = "16000M"

// Config is the cluster's settings for admission.
type Config struct {
	// Unit is what one unit of bitfusion.io/gpu stands for.
	Unit kube.Unit
	// GPUMemoryBytes is one GPU's memory, which a bitfusion.io/gpu-memory
	// request is a share of (BFK's formula, for the quota's count; the
	// lease takes the share of the GPU it lands on).
	GPUMemoryBytes int64
	// SchedulerName is written into the spec.schedulerName of each pod the
	// webhook normalises; empty leaves the pod's own.
	SchedulerName string
	// DefaultTopology is the least link between the GPUs of a pod that
	// asks for more than one and names none (gpupool.io/topology): the
	// cluster's rule, as BFK's affinityRules set it. Empty or "any": none.
	DefaultTopology string
}

// autoManagement lists the values of BFK's auto-management/bitfusion, in
// lower case as BFK compared them: "all" and its synonyms wrapped the
// command, "injection" injected the client only, "none" (and the "no" of
// BFK's older README) did neither.
var autoManagement = []string{"all", "y", "yes", "true", "on", "injection", "none", "n", "no", "false", "off"}

var (
	annotations   = field.NewPath("metadata", "annotations")
	atRequest     = annotations.Key(kube.AnnotationRequest)
	atModels      = annotations.Key(kube.AnnotationModels)
	atTopology    = annotations.Key(kube.AnnotationTopology)
	atAutoManaged = annotations.Key(kube.AnnotationAutoManagement)
	atNodeName    = field.NewPath("spec", "nodeName")
)

// Mutate returns the patch that normalises a created pod, or why it is
// refused. A pod that asks for no bitfusion.io resource gets no patch,
// and is refused if it records a request. A pod created marked as handled
// (a copy of an admitted pod's manifest, or the webhook called again after
// a later webhook changed the pod: reinvocationPolicy IfNeeded) gets no
// patch either, and is refused unless it asks for bitfusion.io/gpu alone,
// as much as its recorded request stands for. So the pod kube-apiserver
// stores is one the pool can lease for, and the quota counts what the pool
// leases. Either way a pod that asks for GPUs and names its node is
// refused: the pool, not its author, places it.
func (c Config) Mutate(pod *corev1.Pod) (Patch, field.ErrorList) {
	if marked(pod) {
		return nil, c.checkRecorded(pod)
	}
	p, errs := c.plan(pod)
	if p != nil {
		return c.patch(pod, p), nil
	}
	if v, recorded := pod.Annotations[kube.AnnotationRequest]; recorded && len(errs) == 0 {
		errs = field.ErrorList{field.Invalid(atRequest, v, "the pod asks for no bitfusion.io resource")}
	}
	return nil, errs
}

// checkRecorded checks a pod marked as handled: its one GPU container asks
// for bitfusion.io/gpu alone, as much as its recorded request stands for.
func (c Config) checkRecorded(pod *corev1.Pod) field.ErrorList {
	gc, errs := findGPUContainer(pod)
	if len(errs) > 0 {
		return errs
	}
	r, recorded, err := kube.RequestOf(pod.Annotations)
	switch {
	case err != nil:
		return field.ErrorList{field.Invalid(atRequest, pod.Annotations[kube.AnnotationRequest], err.Error())}
	case gc == nil && recorded:
		return field.ErrorList{field.Invalid(atRequest, pod.Annotations[kube.AnnotationRequest], "the pod asks for no bitfusion.io/gpu")}
	case gc == nil:
		return nil
	}
	errs = append(checkNodeName(pod), checkAnnotations(pod)...)
	for _, name := range slices.Sorted(maps.Keys(gc.asked)) {
		if name != kube.ResourceGPU {
			a := gc.asked[name]
			errs = append(errs, field.Invalid(a.path, a.value, "a pod marked "+kube.AnnotationStatus+": "+kube.StatusInjected+
				" asks for "+kube.ResourceGPU+" alone (the mutating webhook replaces the others with it)"))
		}
	}
	gpu, ok := gc.asked[kube.ResourceGPU]
	switch {
	case len(errs) > 0:
		return errs
	case !ok:
		return field.ErrorList{field.Required(gc.limits.Key(kube.ResourceGPU), "a pod marked "+kube.AnnotationStatus+": "+kube.StatusInjected+
			" asks for "+kube.ResourceGPU)}
	case !recorded:
		return field.ErrorList{field.Required(atRequest, "a pod marked "+kube.AnnotationStatus+": "+kube.StatusInjected+" records its request")}
	}
	a, errs := recordedAsk(r)
	if len(errs) > 0 {
		return errs
	}
	units, errs := c.units(a)
	if len(errs) == 0 && units != gpu.value {
		errs = append(errs, field.Invalid(atRequest, pod.Annotations[kube.AnnotationRequest], fmt.Sprintf("stands for %s %d (unit %s), but %s is %d",
			kube.ResourceGPU, units, c.Unit, gpu.path, gpu.value)))
	}
	return errs
}

// marked is whether the webhook has handled pod.
func marked(pod *corev1.Pod) bool {
	return pod.Annotations[kube.AnnotationStatus] == kube.StatusInjected
}

// checkNodeName refuses a GPU pod created already bound to a node. The
// pool places GPU pods: kube-scheduler never sees a pod whose
// spec.nodeName is set, so no lease would be taken for it, and the lease
// controller would then take one on that node, over the pool's policy and
// whatever GPUs the node has left.
func checkNodeName(pod *corev1.Pod) field.ErrorList {
	if pod.Spec.NodeName == "" {
		return nil
	}
	return field.ErrorList{field.Invalid(atNodeName, pod.Spec.NodeName,
		"the pool places GPU pods, on the server that holds their lease: leave spec.nodeName empty (a nodeSelector or node affinity narrows where)")}
}

// checkAnnotations checks BFK's auto-management/bitfusion, the only BFK
// annotation whose value gpupool reads.
func checkAnnotations(pod *corev1.Pod) field.ErrorList {
	v, ok := pod.Annotations[kube.AnnotationAutoManagement]
	if !ok || slices.Contains(autoManagement, strings.ToLower(v)) {
		return nil
	}
	return field.ErrorList{field.NotSupported(atAutoManaged, v, autoManagement)}
}

// Package admission is gpupool's admission webhook for pods. It accepts the
// YAML users wrote for Bitfusion on Kubernetes (BFK) and for the
// Bitfusion-on-Kubernetes articles unchanged, and turns each pod's GPU
// request into the one resource the cluster counts: bitfusion.io/gpu in the
// cluster's unit, in requests and limits, so that a ResourceQuota on
// requests.bitfusion.io/gpu counts it and the pool's scheduler places it.
//
// Mutate computes a pod's JSON patch, or refuses the pod when its request
// cannot be normalised. Validate refuses what mutation does not see: a pod
// that arrives already marked as handled (its recorded request must match
// its bitfusion.io/gpu), and an update that would change a handled pod's
// request. Both are pure functions of the pod; NewHandler serves them as
// AdmissionReview v1.
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
	"strconv"
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
}

// autoManagement lists the values of BFK's auto-management/bitfusion, in
// lower case as BFK compared them: "all" and its synonyms wrapped the
// command, "injection" injected the client only, "none" (and the "no" of
// BFK's older README) did neither.
var autoManagement = []string{"all", "y", "yes", "true", "on", "injection", "none", "n", "no", "false", "off"}

var (
	annotations   = field.NewPath("metadata", "annotations")
	atRequest     = annotations.Key(kube.AnnotationRequest)
	atStatus      = annotations.Key(kube.AnnotationStatus)
	atModels      = annotations.Key(kube.AnnotationModels)
	atTopology    = annotations.Key(kube.AnnotationTopology)
	atAutoManaged = annotations.Key(kube.AnnotationAutoManagement)
)

// Mutate returns the patch that normalises pod, or why it is refused. A pod
// that asks for no bitfusion.io resource, or is already marked as handled,
// gets no patch (Validate checks the latter).
func (c Config) Mutate(pod *corev1.Pod) (Patch, field.ErrorList) {
	if marked(pod) {
		return nil, nil
	}
	p, errs := c.plan(pod)
	if p == nil {
		return nil, errs
	}
	return c.patch(pod, p), nil
}

// Validate returns why pod is refused, if it is: on create (old nil), a pod
// that asks for bitfusion.io resources must be marked as handled, ask for
// bitfusion.io/gpu alone, and record a request that stands for as much; on
// update, the recorded request and the mark must not change. An update
// checks nothing else, so that an older pod's finalizers and labels can
// always be changed.
func (c Config) Validate(pod, old *corev1.Pod) field.ErrorList {
	if old != nil {
		return unchanged(pod, old)
	}
	if marked(pod) {
		return c.checkRecorded(pod)
	}
	p, errs := c.plan(pod)
	_, recorded := pod.Annotations[kube.AnnotationRequest]
	switch {
	case len(errs) > 0:
		return errs
	case p != nil:
		return field.ErrorList{field.Required(atStatus, "the pod asks for bitfusion.io resources but the mutating webhook did not normalise it "+
			"(is the MutatingWebhookConfiguration registered?)")}
	case recorded:
		return field.ErrorList{field.Invalid(atRequest, pod.Annotations[kube.AnnotationRequest], "the pod asks for no bitfusion.io resource")}
	}
	return nil
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
	errs = checkAnnotations(pod)
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

// unchanged refuses an update that changes what admission decided: the
// request the pool leases, and the mark that says it was decided.
func unchanged(pod, old *corev1.Pod) field.ErrorList {
	var errs field.ErrorList
	for _, key := range []string{kube.AnnotationRequest, kube.AnnotationStatus} {
		was, had := old.Annotations[key]
		is, has := pod.Annotations[key]
		if was != is || had != has {
			errs = append(errs, field.Invalid(annotations.Key(key), is, "cannot change once the pod is admitted (was "+quoteOrAbsent(was, had)+")"))
		}
	}
	return errs
}

func quoteOrAbsent(v string, ok bool) string {
	if !ok {
		return "absent"
	}
	return strconv.Quote(v)
}

// marked is whether the webhook has handled pod.
func marked(pod *corev1.Pod) bool {
	return pod.Annotations[kube.AnnotationStatus] == kube.StatusInjected
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

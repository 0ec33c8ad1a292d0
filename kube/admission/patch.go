package admission

import (
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpupool/gpupool/kube"
)

// Operation is one operation of a JSON patch (RFC 6902).
type Operation struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// Patch is a JSON patch, what a mutating webhook answers.
type Patch []Operation

// patch normalises pod as p says. Each operation is an "add", which sets a
// member whether or not it exists: a container's whole resources, so that
// no pointer names a bitfusion.io/ resource, and each annotation set.
func (c Config) patch(pod *corev1.Pod, p *plan) Patch {
	var ops Patch
	was := p.gpu.container.Resources
	res := *was.DeepCopy()
	gpu := *resource.NewQuantity(p.units, resource.DecimalSI)
	for _, list := range []*corev1.ResourceList{&res.Limits, &res.Requests} {
		if *list == nil {
			*list = corev1.ResourceList{}
		}
		for _, name := range bfkNames {
			delete(*list, name)
		}
		(*list)[kube.ResourceGPU] = gpu
	}
	if !equality.Semantic.DeepEqual(res, was) {
		ops = append(ops, Operation{"add", p.gpu.pointer + "/resources", res})
	}
	// The annotations the webhook sets, one by one: the patch carries what
	// changes, never the pod's other annotations back.
	set := map[string]string{kube.AnnotationRequest: p.request.Annotation(), kube.AnnotationStatus: kube.StatusInjected}
	if pod.Annotations == nil {
		ops = append(ops, Operation{"add", "/metadata/annotations", set})
	} else {
		for _, key := range slices.Sorted(maps.Keys(set)) {
			ops = append(ops, Operation{"add", "/metadata/annotations/" + pointerEscape(key), set[key]})
		}
	}
	if c.SchedulerName != "" && pod.Spec.SchedulerName != c.SchedulerName {
		ops = append(ops, Operation{"add", "/spec/schedulerName", c.SchedulerName})
	}
	return ops
}

// pointerEscape escapes a key for a JSON pointer (RFC 6901): "~" as "~0",
// "/" as "~1".
func pointerEscape(key string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(key)
}

package admission

import (
	"maps"

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
// member whether or not it exists, and sets a whole map or object: a JSON
// pointer then never has to escape the "/" of bitfusion.io/ names.
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
	annotations := maps.Clone(pod.Annotations)
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[kube.AnnotationRequest] = p.request.Annotation()
	annotations[kube.AnnotationStatus] = kube.StatusInjected
	ops = append(ops, Operation{"add", "/metadata/annotations", annotations})
	if c.SchedulerName != "" && pod.Spec.SchedulerName != c.SchedulerName {
		ops = append(ops, Operation{"add", "/spec/schedulerName", c.SchedulerName})
	}
	return ops
}

package admission

import (
	"errors"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpupool/gpupool/internal/jsonscan"
)

// reviewed is what the webhook reads of an AdmissionReview. It decodes
// only the fields it decides on, so that a review costs what the webhook
// reads, whatever else a pod carries (a pod's env, its other annotations:
// megabytes a caller controls).
type reviewed struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Request    *reviewRequest `json:"request"`
}

type reviewRequest struct {
	UID         types.UID                   `json:"uid"`
	Resource    metav1.GroupVersionResource `json:"resource"`
	SubResource string                      `json:"subResource"`
	Operation   admissionv1.Operation       `json:"operation"`
	Object      *reviewedPod                `json:"object"`
}

// reviewedPod is what Mutate reads of a pod.
type reviewedPod struct {
	Metadata struct {
		Name         string          `json:"name"`
		GenerateName string          `json:"generateName"`
		Namespace    string          `json:"namespace"`
		Annotations  readAnnotations `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		SchedulerName  string              `json:"schedulerName"`
		NodeName       string              `json:"nodeName"`
		Containers     []reviewedContainer `json:"containers"`
		InitContainers []reviewedContainer `json:"initContainers"`
	} `json:"spec"`
}

type reviewedContainer struct {
	Name      string                      `json:"name"`
	Resources corev1.ResourceRequirements `json:"resources"`
}

func (p *reviewedPod) pod() *corev1.Pod {
	containers := func(in []reviewedContainer) []corev1.Container {
		var out []corev1.Container
		for _, c := range in {
			out = append(out, corev1.Container{Name: c.Name, Resources: c.Resources})
		}
		return out
	}
	m := &p.Metadata
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: m.Name, GenerateName: m.GenerateName, Namespace: m.Namespace, Annotations: m.Annotations},
		Spec: corev1.PodSpec{SchedulerName: p.Spec.SchedulerName, NodeName: p.Spec.NodeName,
			Containers: containers(p.Spec.Containers), InitContainers: containers(p.Spec.InitContainers)},
	}
}

// readPrefixes are the annotations the webhook reads: gpupool's own and
// BFK's. It keeps no other.
var readPrefixes = []string{"gpupool.io/", "auto-management/", "bitfusion-client/"}

// maxAnnotationKey is the longest valid annotation key: a DNS subdomain
// prefix, a slash and a name. A longer key is none the webhook reads.
const maxAnnotationKey = 253 + 1 + 63

// readAnnotations are a pod's annotations that the webhook reads. Decoding
// skips the others without copying them.
type readAnnotations map[string]string

// UnmarshalJSON implements json.Unmarshaler. json.Unmarshal has checked
// the whole review's syntax before it calls this, so the scan below only
// walks valid JSON: an object of strings, or null.
func (a *readAnnotations) UnmarshalJSON(b []byte) error {
	s := jsonscan.New(b)
	s.Space()
	if s.Literal("null") {
		return nil
	}
	if !s.Byte('{') {
		return errors.New("metadata.annotations: not an object")
	}
	kept := readAnnotations{}
	for s.Space(); !s.Byte('}'); s.Space() {
		s.Byte(',')
		s.Space()
		rawKey, ok := s.Str()
		if !ok {
			return errors.New("metadata.annotations: a key that is not a string")
		}
		s.Space()
		s.Byte(':')
		s.Space()
		rawValue, ok := s.Str()
		if !ok {
			return errors.New("metadata.annotations: a value that is not a string")
		}
		if len(rawKey) > maxAnnotationKey+2 {
			continue
		}
		key, err := jsonscan.Unquote(rawKey)
		if err != nil {
			return err
		}
		if !read(key) {
			continue
		}
		if kept[key], err = jsonscan.Unquote(rawValue); err != nil {
			return err
		}
	}
	*a = kept
	return nil
}

func read(key string) bool {
	for _, p := range readPrefixes {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

package admission

import (
	"os"
	"path/filepath"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/gpupool/gpupool/internal/golden"
	"github.com/gpupool/gpupool/kube"
)

// examples are what users write (testdata/*.yaml): two pods of BFK's, a
// Deployment and a Job of BFK's, and a pod of the articles'.
var examples = []string{"pod-percent.yaml", "pod-memory.yaml", "deployment.yaml", "job.yaml", "pod-gpu.yaml"}

// goldenUnits are the units the examples are mutated in, by the directory
// of their golden files: the articles' slices of GPU memory among them.
var goldenUnits = map[string]kube.Unit{"percent": kube.UnitPercent, "gpus": kube.UnitGPUs, "memory-8Gi": kube.MemoryUnit(8 << 30)}

// TestGolden mutates each example's pod in each unit and compares the pod,
// or the refusal, with testdata/golden/<unit>/<example>.
func TestGolden(t *testing.T) {
	for dir, unit := range goldenUnits {
		for _, name := range examples {
			t.Run(dir+"/"+name, func(t *testing.T) {
				pod := examplePod(t, filepath.Join("testdata", name))
				c := config(unit)
				patch, errs := c.Mutate(pod)
				var got []byte
				if len(errs) > 0 {
					got = []byte("denied: " + errs.ToAggregate().Error() + "\n")
				} else {
					b, err := yaml.Marshal(apply(t, pod, patch))
					if err != nil {
						t.Fatal(err)
					}
					got = b
				}
				golden.Check(t, filepath.Join("testdata", "golden", dir, name), got)
			})
		}
	}
}

// examplePod reads a pod, or the pod a Deployment's or a Job's template
// makes, from a YAML file.
func examplePod(t *testing.T, path string) *corev1.Pod {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(b, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	fromTemplate := func(owner string, tmpl corev1.PodTemplateSpec) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: owner + "-", Labels: tmpl.Labels, Annotations: tmpl.Annotations}, Spec: tmpl.Spec}
	}
	switch o := obj.(type) {
	case *corev1.Pod:
		return o
	case *appsv1.Deployment:
		return fromTemplate(o.Name, o.Spec.Template)
	case *batchv1.Job:
		return fromTemplate(o.Name, o.Spec.Template)
	}
	t.Fatalf("%s: a %T is no example", path, obj)
	return nil
}

package kube

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpupool/gpupool/allocator/api"
)

// TestLeaseRequest: a pod's lease asks what its annotation records, with
// the CPU and memory kube-scheduler counts (containers summed, an init
// container larger than them all counted instead), owned by the pod and
// keyed by its UID, until released.
func TestLeaseRequest(t *testing.T) {
	requests := func(cpu, memory string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory)}}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer-0", Namespace: "ml", UID: "uid-0", Labels: map[string]string{"app": "tf"},
			Annotations: map[string]string{AnnotationRequest: Request{GPUAmount: 2, GPUPercent: 50, Models: []string{"A100"}, Topology: "nvlink"}.Annotation()}},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "fetch", Resources: requests("100m", "8Gi")}},
			Containers:     []corev1.Container{{Name: "main", Resources: requests("1500m", "4Gi")}, {Name: "sidecar", Resources: requests("500m", "1Gi")}},
		},
	}
	got, err := LeaseRequest(pod, []string{"gpu-1", "gpu-2"})
	if err != nil {
		t.Fatal(err)
	}
	want := api.AcquireRequest{
		Namespace: "ml", GPUAmount: 2, GPUPercent: 50, Models: []string{"A100"}, Topology: "nvlink", CPU: "2", Memory: "8Gi",
		Servers: []string{"gpu-1", "gpu-2"}, Owner: api.Owner{Pod: "trainer-0", UID: "uid-0", Labels: map[string]string{"app": "tf"}},
		IdempotencyKey: "uid-0", UntilReleased: true,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("LeaseRequest =\n%+v, want\n%+v", got, want)
	}

	pod.Spec = corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}}}
	if got, err := LeaseRequest(pod, nil); err != nil || got.CPU != "" || got.Memory != "" {
		t.Errorf("a pod asking no CPU or memory: CPU %q, memory %q, %v; want none", got.CPU, got.Memory, err)
	}
	delete(pod.Annotations, AnnotationRequest)
	if _, err := LeaseRequest(pod, nil); err == nil || err.Error() != "pod ml/trainer-0 has no annotation gpupool.io/request" {
		t.Errorf("a pod without its request: %v", err)
	}
}

func TestLeaseAnnotations(t *testing.T) {
	l := api.Lease{ID: "lease-000007", GPUs: []api.LeaseGPU{{Index: 3, UUID: "GPU-c"}, {Index: 1, UUID: "GPU-a"}}}
	want := map[string]string{AnnotationLease: "lease-000007", AnnotationGPUs: "GPU-c,GPU-a"}
	if got := LeaseAnnotations(&l); !reflect.DeepEqual(got, want) {
		t.Errorf("LeaseAnnotations = %v, want %v", got, want)
	}
}

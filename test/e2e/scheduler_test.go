package e2e

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/kube"
	e2ekube "github.com/gpupool/gpupool/test/e2e/kube"
)

// TestSchedulerPlacesThroughThePool runs gpupool-scheduler as deployed
// beside kube-scheduler (plain HTTP on loopback, the allocator's admin
// token, a kubeconfig) under a real kube-scheduler whose gpupool-scheduler
// profile calls it. A pod is placed on the GPU server that holds its new
// lease, of the two nodes kube-scheduler finds feasible, and carries the
// lease and its GPUs: kube-apiserver copies them from the Binding onto the
// pod. A pod the pool cannot place stays Pending with a FailedScheduling
// event giving the allocator's reason, and another, while the allocator is
// down, one saying that it cannot be reached. The lease ends with its pod.
func TestSchedulerPlacesThroughThePool(t *testing.T) {
	bins := os.Getenv("KUBE_BIN_DIR")
	if bins == "" {
		t.Skip("KUBE_BIN_DIR is not set: `make e2e` builds the control plane (test/e2e/kube/build.sh) and sets it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cp, err := e2ekube.Start(ctx, e2ekube.Options{BinDir: bins, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	logs := &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("control plane:\n%s\ngpupool-scheduler:\n%s", cp.Logs(20), tail(logs.String(), 30))
		}
	})

	config := writePoolConfig(t, map[string]int64{"default": noQuota})
	a := startAllocator(t, "--data-dir", t.TempDir(), "--config", config.Path, "--heartbeat-timeout", "1h")
	register(t, newClient(t, a.URL, config.Servers), gpuServer("gpu-0", 2))
	for _, node := range []string{"gpu-0", "cpu-0"} { // cpu-0 is no GPU server
		if err := cp.AddKwokNode(ctx, node, map[string]string{"cpu": "96", "memory": "512Gi", "pods": "110"}); err != nil {
			t.Fatal(err)
		}
	}
	extender := "127.0.0.1:" + freePort(t)
	startBinary(t, logs, "gpupool-scheduler", regexp.MustCompile(`extender serving`), "--listen", extender,
		"--metrics-listen", "127.0.0.1:0", "--allocator", a.URL, "--token-file", config.adminTokenFile(t), "--kubeconfig", cp.Kubeconfig)
	if err := cp.StartScheduler(ctx, e2ekube.SchedulerOptions{ExtenderURL: "http://" + extender}); err != nil {
		t.Fatal(err)
	}
	pods := cp.Client.CoreV1().Pods("default")
	create := func(name string, gpus int, percent int, gpuUnits string) *corev1.Pod {
		t.Helper()
		pod, err := pods.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "tf-training"},
				Annotations: map[string]string{kube.AnnotationRequest: kube.Request{GPUAmount: gpus, GPUPercent: percent}.Annotation()}},
			Spec: corev1.PodSpec{
				SchedulerName: kube.SchedulerName,
				Tolerations:   []corev1.Toleration{e2ekube.KwokToleration},
				Containers: []corev1.Container{{Name: "main", Image: "trainer", Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), kube.ResourceGPU: resource.MustParse(gpuUnits)},
					Limits:   corev1.ResourceList{kube.ResourceGPU: resource.MustParse(gpuUnits)}}}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return pod
	}
	admin := newClient(t, a.URL, config.Admin)
	leasesOf := func(pod *corev1.Pod) []api.Lease {
		t.Helper()
		ls, err := admin.Leases(ctx, client.LeaseFilter{Namespace: "default", OwnerUID: string(pod.UID)})
		if err != nil {
			t.Fatal(err)
		}
		return ls
	}

	trainer := create("trainer-0", 1, 50, "50")
	var bound *corev1.Pod
	waitFor(t, func() bool {
		bound, err = pods.Get(ctx, trainer.Name, metav1.GetOptions{})
		return err == nil && bound.Spec.NodeName != ""
	})
	held := leasesOf(trainer)
	if len(held) != 1 {
		t.Fatalf("the pod holds %+v, want one lease", held)
	}
	lease := held[0]
	if bound.Spec.NodeName != "gpu-0" || lease.Server != "gpu-0" || !lease.UntilReleased || lease.CPUMilli != 2000 || lease.Owner.Pod != trainer.Name {
		t.Errorf("pod on %q, lease %+v; want both on gpu-0, until released, 2 CPUs, owned by %s", bound.Spec.NodeName, lease, trainer.Name)
	}
	if got := bound.Annotations; got[kube.AnnotationLease] != lease.ID || got[kube.AnnotationGPUs] != lease.GPUs[0].UUID {
		t.Errorf("pod annotations %v, want %s=%s and %s=%s", got, kube.AnnotationLease, lease.ID, kube.AnnotationGPUs, lease.GPUs[0].UUID)
	}

	failedScheduling := func(pod *corev1.Pod, why string) {
		t.Helper()
		selector := fields.Set{"involvedObject.name": pod.Name, "reason": "FailedScheduling"}.String()
		var seen []string
		defer func() {
			if t.Failed() {
				t.Logf("FailedScheduling events of %s: %q", pod.Name, seen)
			}
		}()
		waitFor(t, func() bool {
			events, err := cp.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: selector})
			seen = seen[:0]
			for _, e := range events.Items {
				seen = append(seen, e.Message)
			}
			return err == nil && strings.Contains(strings.Join(seen, "\n"), why)
		})
	}
	failedScheduling(create("big", 2, 0, "200"), "gpupool allocator: no server has 2 free GPUs")

	if err := pods.Delete(ctx, trainer.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(leasesOf(trainer)) == 0 })

	a.kill()
	failedScheduling(create("waiting", 1, 50, "50"), "gpupool allocator: cannot reach the allocator at "+a.URL)
}

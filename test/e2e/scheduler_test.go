package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/kube"
	e2ekube "github.com/gpupool/gpupool/test/e2e/kube"
)

// TestSchedulerBindsWithTheLease runs gpupool-scheduler as deployed beside
// kube-scheduler (plain HTTP on loopback, the allocator's admin token, a
// kubeconfig) against a real kube-apiserver and allocator, and calls it as
// kube-scheduler does: filter with the feasible nodes' names answers the
// GPU server that holds the pod's new lease, and bind's one Binding puts
// the pod on that node with the lease and its GPUs as annotations, which
// kube-apiserver copies from the Binding onto the pod.
func TestSchedulerBindsWithTheLease(t *testing.T) {
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
	if err := cp.AddKwokNode(ctx, "gpu-0", map[string]string{"cpu": "96", "memory": "512Gi", "pods": "110"}); err != nil {
		t.Fatal(err)
	}
	extender := "http://127.0.0.1:" + freePort(t)
	startBinary(t, logs, "gpupool-scheduler", regexp.MustCompile(`extender serving`), "--listen", extender[len("http://"):],
		"--metrics-listen", "127.0.0.1:0", "--allocator", a.URL, "--token-file", config.adminTokenFile(t), "--kubeconfig", cp.Kubeconfig)

	pod, err := cp.Client.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer-0", Labels: map[string]string{"app": "tf-training"},
			Annotations: map[string]string{kube.AnnotationRequest: kube.Request{GPUAmount: 1, GPUPercent: 50}.Annotation()}},
		Spec: corev1.PodSpec{
			SchedulerName: "gpupool-scheduler", // none runs: the test calls the extender
			Tolerations:   []corev1.Toleration{e2ekube.KwokToleration},
			Containers: []corev1.Container{{Name: "main", Image: "trainer", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), kube.ResourceGPU: resource.MustParse("50")},
				Limits:   corev1.ResourceList{kube.ResourceGPU: resource.MustParse("50")}}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	var filtered extenderv1.ExtenderFilterResult
	postExtender(t, extender+"/filter", extenderv1.ExtenderArgs{Pod: pod, NodeNames: &[]string{"cpu-only-node", "gpu-0"}}, &filtered)
	if filtered.Error != "" || filtered.NodeNames == nil || !slices.Equal(*filtered.NodeNames, []string{"gpu-0"}) {
		t.Fatalf("filter answered %+v, want gpu-0 alone", filtered)
	}
	var bound extenderv1.ExtenderBindingResult
	postExtender(t, extender+"/bind", extenderv1.ExtenderBindingArgs{PodName: pod.Name, PodNamespace: pod.Namespace, PodUID: pod.UID, Node: "gpu-0"}, &bound)
	if bound.Error != "" {
		t.Fatalf("bind: %s", bound.Error)
	}

	leases, err := newClient(t, a.URL, config.Admin).Leases(ctx, client.LeaseFilter{Namespace: "default", OwnerUID: string(pod.UID)})
	if err != nil || len(leases) != 1 {
		t.Fatalf("the pod's leases: %+v (%v), want one", leases, err)
	}
	lease := leases[0]
	if lease.Server != "gpu-0" || !lease.UntilReleased || lease.CPUMilli != 2000 || lease.Owner.Pod != pod.Name || lease.Owner.Labels["app"] != "tf-training" {
		t.Errorf("lease %+v, want on gpu-0 until released, 2 CPUs, owned by %s with its labels", lease, pod.Name)
	}
	got, err := cp.Client.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.NodeName != "gpu-0" || got.Annotations[kube.AnnotationLease] != lease.ID || got.Annotations[kube.AnnotationGPUs] != lease.GPUs[0].UUID {
		t.Errorf("pod on node %q with annotations %v, want gpu-0, %s=%s and %s=%s", got.Spec.NodeName, got.Annotations,
			kube.AnnotationLease, lease.ID, kube.AnnotationGPUs, lease.GPUs[0].UUID)
	}
}

// postExtender calls the extender as kube-scheduler does: a JSON POST
// answered 200 with a JSON result.
func postExtender(t *testing.T, url string, args, result any) {
	t.Helper()
	body, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s answered %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(result); err != nil {
		t.Fatal(err)
	}
}

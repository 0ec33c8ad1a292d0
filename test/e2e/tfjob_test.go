package e2e

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/kube"
	e2ekube "github.com/gpupool/gpupool/test/e2e/kube"
)

// TestTFJobThroughThePool runs the articles' TFJob, as their users write
// it, by the real Kubeflow training operator, in each unit the articles
// use: whole GPUs (gpus), and the slices of GPU memory of their values.yaml
// (memoryPerUnit: 8Gi). Its four workers are admitted by the webhook,
// counted against the namespace's quota, placed by the pool on the
// labelled GPU servers alone, each on the server of its lease: two GPUs,
// or 16Gi of one GPU's memory; deleting the TFJob ends the leases.
func TestTFJobThroughThePool(t *testing.T) {
	for _, tc := range []struct {
		unit kube.Unit
		// gpus and memory are each worker's lease: its GPUs, and the
		// memory of each (0: whole GPUs).
		gpus   int
		memory int64
	}{
		{kube.UnitGPUs, 2, 0},
		{kube.MemoryUnit(8 << 30), 1, 16 << 30},
	} {
		t.Run(string(tc.unit), func(t *testing.T) { runTFJob(t, tc.unit, tc.gpus, tc.memory) })
	}
}

func runTFJob(t *testing.T, unit kube.Unit, gpusEach int, memoryEach int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const ns = "training"
	pool := startKubePool(t, ctx, kubePoolOptions{Unit: unit, Namespaces: []string{ns}})
	bitfusionNode := map[string]string{"bitfusion-node": "enabled"}
	pool.addNodes(t, ctx, 4, bitfusionNode, "gpu-0", "gpu-1", "gpu-2")
	// A GPU server too, but not labelled as Bitfusion's: the TFJob's
	// nodeSelector keeps its workers off it.
	pool.addNodes(t, ctx, 4, nil, "unlabelled-0")
	c := pool.CP.Client
	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "bf-gpu"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"requests." + kube.ResourceGPU: resource.MustParse("32")}}}
	if _, err := c.CoreV1().ResourceQuotas(ns).Create(ctx, quota, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	workers, deleteJob := submitTFJob(t, ctx, pool.CP, ns)
	const unitsEach = 2
	for _, p := range workers {
		requested := p.Spec.Containers[0].Resources.Requests[kube.ResourceGPU]
		if requested.Value() != unitsEach {
			t.Errorf("worker %s: requests %s %s, annotations %v; want %d, normalised by the webhook", p.Name, requested.String(), kube.ResourceGPU, p.Annotations, unitsEach)
		}
		leases := pool.leasesOf(t, ctx, &p)
		if len(leases) != 1 || leases[0].Server != p.Spec.NodeName || len(leases[0].GPUs) != gpusEach || p.Annotations[kube.AnnotationLease] != leases[0].ID {
			t.Fatalf("worker %s on %s holds %+v; want one lease of %d GPUs on its node", p.Name, p.Spec.NodeName, leases, gpusEach)
		}
		for _, g := range leases[0].GPUs {
			if memoryEach > 0 && g.MemoryBytes != memoryEach || memoryEach == 0 && g.Percent != 100 {
				t.Errorf("worker %s holds %+v of a GPU; want %d bytes of its memory (0: all of it)", p.Name, g, memoryEach)
			}
		}
		if p.Spec.NodeName == "unlabelled-0" {
			t.Errorf("worker %s is on a node without bitfusion-node=enabled", p.Name)
		}
	}
	waitFor(t, func() bool {
		q, err := c.CoreV1().ResourceQuotas(ns).Get(ctx, quota.Name, metav1.GetOptions{})
		used := q.Status.Used["requests."+kube.ResourceGPU]
		return err == nil && used.Value() == int64(len(workers))*unitsEach
	})

	deleteJob()
	waitForUpTo(t, time.Minute, func() bool {
		leases, err := pool.Admin.Leases(ctx, client.LeaseFilter{Namespace: ns})
		return err == nil && len(leases) == 0
	})
}

// submitTFJob starts the training operator on cp, creates the articles'
// TFJob in ns, and returns its four workers once each is bound, and what
// deletes the TFJob.
func submitTFJob(t *testing.T, ctx context.Context, cp *e2ekube.ControlPlane, ns string) (workers []corev1.Pod, deleteJob func()) {
	t.Helper()
	if err := cp.StartTrainingOperator(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("testdata/kube/tfjob-resnet50-bf.yaml")
	if err != nil {
		t.Fatal(err)
	}
	job := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(b, &job.Object); err != nil {
		t.Fatal(err)
	}
	tfJobs := dynamic.NewForConfigOrDie(cp.Config).Resource(e2ekube.TFJobs).Namespace(ns)
	if _, err := tfJobs.Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const replicas = 4
	selector := metav1.ListOptions{LabelSelector: "training.kubeflow.org/job-name=" + job.GetName()}
	waitForUpTo(t, time.Minute, func() bool {
		list, err := cp.Client.CoreV1().Pods(ns).List(ctx, selector)
		if err != nil {
			t.Fatal(err)
		}
		workers = slices.DeleteFunc(list.Items, func(p corev1.Pod) bool { return p.Spec.NodeName == "" })
		return len(workers) == replicas
	})
	return workers, func() {
		if err := tfJobs.Delete(ctx, job.GetName(), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

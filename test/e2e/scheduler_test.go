package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpupool/gpupool/kube"
)

// TestSchedulerPlacesThroughThePool runs gpupool-scheduler as deployed
// beside kube-scheduler (plain HTTP on loopback, the allocator's admin
// token, a kubeconfig) under a real kube-scheduler whose gpupool-scheduler
// profile calls it. A pod, as BFK's users write it and the webhook admits
// it, is placed on the GPU server that holds its new lease, of the two
// nodes kube-scheduler finds feasible, and carries the lease and its GPUs:
// kube-apiserver copies them from the Binding onto the pod. A pod the pool
// cannot place stays Pending with a FailedScheduling event giving the
// allocator's reason, and another, while the allocator is down, one
// saying that it cannot be reached. The lease ends with its pod. A pod
// whose only fit is a node kube-scheduler's own filters refuse (a taint)
// waits, saying why, and is placed there once the taint goes, with no
// lease left elsewhere. All of it both ways: through gpupool-scheduler's
// extender, and through gpupool-kube-scheduler's plugin, which asks the
// pool first and has kube-scheduler check the lease's node alone.
func TestSchedulerPlacesThroughThePool(t *testing.T) {
	for _, way := range []struct {
		name   string
		plugin bool
	}{{"extender", false}, {"plugin", true}} {
		t.Run(way.name, func(t *testing.T) { testSchedulerPlacesThroughThePool(t, way.plugin) })
	}
}

func testSchedulerPlacesThroughThePool(t *testing.T, plugin bool) {
	if plugin {
		// Built (a minute or more) before the test's clock starts.
		gpupoolKubeScheduler(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pool := startKubePool(t, ctx, kubePoolOptions{Namespaces: []string{"training"}, Extender: !plugin})
	pool.addNodes(t, ctx, 2, nil, "gpu-0")
	pool.addNodes(t, ctx, 0, nil, "cpu-0")
	pods := pool.CP.Client.CoreV1().Pods("training")
	create := func(name string, gpus, percent int) *corev1.Pod {
		t.Helper()
		pod, err := pods.Create(ctx, bfkPod(name, gpus, percent), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return pod
	}

	trainer := create("trainer-0", 1, 50)
	waitBound := func(pod *corev1.Pod) *corev1.Pod { return pool.waitBound(t, ctx, pod) }
	bound := waitBound(trainer)
	held := pool.leasesOf(t, ctx, trainer)
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

	big := create("big", 2, 0)
	pool.waitFailedScheduling(t, ctx, big, "gpupool allocator: no server has 2 free GPUs")
	// Else it takes both GPUs once the trainer leaves them.
	if err := pods.Delete(ctx, big.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}

	if err := pods.Delete(ctx, trainer.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(pool.leasesOf(t, ctx, trainer)) == 0 })

	// The allocator down: a new pod waits, saying why; once it returns, on
	// its data, the lease it had is still there and the pod is placed.
	kept := create("kept", 1, 50)
	waitBound(kept)
	keptLeases := pool.leasesOf(t, ctx, kept)
	pool.Allocator.kill()
	waiting := create("waiting", 1, 50)
	pool.waitFailedScheduling(t, ctx, waiting, "gpupool allocator: cannot reach the allocator at "+pool.Allocator.URL)
	pool.restartAllocator(t)
	waitBound(waiting)
	if got := pool.leasesOf(t, ctx, kept); len(got) != 1 || len(keptLeases) != 1 || got[0].ID != keptLeases[0].ID {
		t.Errorf("after the allocator's restart, %s holds %+v; want the lease it held, %+v", kept.Name, got, keptLeases)
	}
	if got := pool.leasesOf(t, ctx, waiting); len(got) != 1 {
		t.Errorf("%s, placed once the allocator returned, holds %+v; want one lease", waiting.Name, got)
	}

	// gpu-1 alone has two free GPUs, but a taint keeps the pod off it.
	pool.addNodes(t, ctx, 2, nil, "gpu-1")
	taint := corev1.Taint{Key: "example.com/maintenance", Effect: corev1.TaintEffectNoSchedule}
	setTaints := func(taints ...corev1.Taint) {
		t.Helper()
		node, err := pool.CP.Client.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Spec.Taints = append(slices.DeleteFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == taint.Key }), taints...)
		if _, err := pool.CP.Client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setTaints(taint)
	whole := create("whole", 2, 0)
	pool.waitFailedScheduling(t, ctx, whole, "gpupool allocator: no server has 2 free GPUs")
	if got := pool.leasesOf(t, ctx, whole); len(got) != 0 {
		t.Errorf("%s, unschedulable, holds %+v", whole.Name, got)
	}
	setTaints()
	if got := waitBound(whole); got.Spec.NodeName != "gpu-1" {
		t.Errorf("%s bound to %s, want gpu-1", whole.Name, got.Spec.NodeName)
	}
	if got := pool.leasesOf(t, ctx, whole); len(got) != 1 || got[0].Server != "gpu-1" {
		t.Errorf("%s holds %+v, want one lease on gpu-1", whole.Name, got)
	}
}

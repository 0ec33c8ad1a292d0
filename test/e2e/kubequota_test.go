package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/kube"
)

// TestPoolQuotaAndFaults runs gpupool on a control plane in BFK's unit,
// percent, with pods as BFK's users write them: the namespace quota
// counts them in kube-apiserver and, set by the lease controller, in the
// allocator, alike; and no pod or lease is lost or doubled when
// gpupool-scheduler dies mid-burst, or when a node goes.
func TestPoolQuotaAndFaults(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const quotaNS, burstNS = "quota", "burst"
	pool := startKubePool(t, ctx, kubePoolOptions{Namespaces: []string{quotaNS, burstNS}})
	pool.addNodes(t, ctx, 4, nil, "gpu-0", "gpu-1", "gpu-2", "gpu-3")

	t.Run("quota", func(t *testing.T) {
		checkQuota(t, pool.CP.Client, quotaNS)
		pods := pool.CP.Client.CoreV1().Pods(quotaNS)
		for _, name := range []string{"second", "third"} {
			pod, err := pods.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			pool.waitBound(t, ctx, pod)
			if leases := pool.leasesOf(t, ctx, pod); len(leases) != 1 {
				t.Errorf("pod %s holds %+v, want one lease", name, leases)
			}
		}
		q, err := pool.CP.Client.CoreV1().ResourceQuotas(quotaNS).Get(ctx, "bf-gpu", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		used := q.Status.Used["requests."+kube.ResourceGPU]
		// The lease controller sets the allocator's quota from the
		// ResourceQuota; the first pod's lease ends with it.
		waitFor(t, func() bool {
			quotas, err := pool.Admin.Quotas(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range quotas {
				if q.Namespace == quotaNS {
					return q.Limited && q.HardPercent == 100 && q.UsedPercent == float64(used.Value())
				}
			}
			return false
		})
		// /metrics shows the quota and its use in GPUs: 100% is one GPU.
		m := metrics(t, pool.Allocator.URL)
		for _, want := range []string{
			fmt.Sprintf("bitfusion_namespace_quota_gpus{namespace=%q} 1", quotaNS),
			fmt.Sprintf("bitfusion_namespace_allocated_gpus{namespace=%q} %g", quotaNS, float64(used.Value())/100),
		} {
			if !strings.Contains(m, want+"\n") {
				t.Errorf("/metrics lacks %s:\n%s", want, grep(m, "bitfusion_namespace_"))
			}
		}
	})

	// Not subtests: a gpupool-scheduler or kube-scheduler started again
	// lives until the test that starts it ends, and the node's deletion
	// needs it.
	checkSchedulerRestartedMidBurst(t, ctx, pool, burstNS)
	checkNodeDeleted(t, ctx, pool, "gpu-0")
}

// checkSchedulerRestartedMidBurst kills the pool's kube-scheduler and
// gpupool-scheduler once some of a burst of pods in ns are bound, and
// starts them again: every pod ends bound
// once, holding one lease, on its node, and no lease is left without its
// pod.
func checkSchedulerRestartedMidBurst(t *testing.T, ctx context.Context, pool *kubePool, ns string) {
	t.Helper()
	pods := pool.CP.Client.CoreV1().Pods(ns)
	const burst = 30
	for i := range burst {
		if _, err := pods.Create(ctx, bfkPod(fmt.Sprintf("burst-%d", i), 1, 25), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if i == burst/3 {
			waitFor(t, func() bool { return boundPods(t, ctx, pool, ns) > 0 })
			pool.killKubeScheduler()
			pool.killScheduler()
		}
	}
	pool.startScheduler(t)
	pool.startKubeScheduler(t, ctx)
	waitForUpTo(t, time.Minute, func() bool { return boundPods(t, ctx, pool, ns) == burst })
	list, err := pods.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pod := range list.Items {
		leases := pool.leasesOf(t, ctx, &pod)
		if len(leases) != 1 || leases[0].Server != pod.Spec.NodeName || leases[0].ID != pod.Annotations[kube.AnnotationLease] {
			t.Errorf("pod %s on %s, annotated %s, holds %+v; want one lease, that one, on its node",
				pod.Name, pod.Spec.NodeName, pod.Annotations[kube.AnnotationLease], leases)
		}
	}
	if all, err := pool.Admin.Leases(ctx, client.LeaseFilter{Namespace: ns}); err != nil || len(all) != burst {
		t.Errorf("namespace %s has %d leases (%v), want one per pod, %d", ns, len(all), err, burst)
	}
}

// checkNodeDeleted deletes a node that holds leases: the lease controller
// releases them.
func checkNodeDeleted(t *testing.T, ctx context.Context, pool *kubePool, node string) {
	t.Helper()
	held, err := pool.Admin.Leases(ctx, client.LeaseFilter{Server: node})
	if err != nil || len(held) == 0 {
		t.Fatalf("%s holds %d leases (%v); want some to release", node, len(held), err)
	}
	if err := pool.CP.Client.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Before kube-controller-manager deletes the node's pods (40 s
	// later): the lease controller releases their leases itself, once the
	// replica started again leads, when the killed one's election Lease
	// has run out (15 s).
	waitForUpTo(t, 30*time.Second, func() bool {
		held, err := pool.Admin.Leases(ctx, client.LeaseFilter{Server: node})
		return err == nil && len(held) == 0
	})
}

// boundPods is how many of ns's pods are bound to a node.
func boundPods(t *testing.T, ctx context.Context, pool *kubePool, ns string) int {
	t.Helper()
	list, err := pool.CP.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermNotEqualSelector("spec.nodeName", "").String()})
	if err != nil {
		t.Fatal(err)
	}
	return len(list.Items)
}

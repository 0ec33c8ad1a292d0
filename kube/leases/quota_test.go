package leases

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/kube"
)

func resourceQuota(name, hard string) *corev1.ResourceQuota {
	return namespacedQuota(namespace, name, hard)
}

func namespacedQuota(ns, name, hard string) *corev1.ResourceQuota {
	return &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{requestsGPU: resource.MustParse(hard), corev1.ResourcePods: resource.MustParse("10")}}}
}

// quotaOf is the allocator's quota of team-a; false when it has none.
func (e *testEnv) quotaOf() (allocator.Share, bool) {
	return e.namespaceQuota(namespace)
}

func (e *testEnv) namespaceQuota(ns string) (allocator.Share, bool) {
	e.t.Helper()
	qs, err := e.admin.Quotas(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, q := range qs {
		if q.Namespace == ns && q.Limited {
			return q.Core().Hard, true
		}
	}
	return 0, false
}

// TestQuotaFollowsResourceQuotas: the allocator's quota is the least of
// the namespace's ResourceQuotas, follows their changes, and goes with
// the last of them.
func TestQuotaFollowsResourceQuotas(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	e.run()
	quotaIs := func(want allocator.Share) func() bool {
		return func() bool { q, ok := e.quotaOf(); return ok && q == want }
	}
	e.create(resourceQuota("big", "300"))
	eventually(t, "the quota is 300%", quotaIs(allocator.SharePercent(300)))
	e.create(resourceQuota("small", "150"))
	eventually(t, "the quota is the least, 150%", quotaIs(allocator.SharePercent(150)))
	big := resourceQuota("big", "100")
	if _, err := e.kube.CoreV1().ResourceQuotas(namespace).Update(e.ctx, big, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the quota follows the changed one down to 100%", quotaIs(allocator.SharePercent(100)))
	for _, name := range []string{"big", "small"} {
		if err := e.kube.CoreV1().ResourceQuotas(namespace).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the quota is gone with the ResourceQuotas", func() bool { _, ok := e.quotaOf(); return !ok })
}

// TestQuotaInGPUs: under the gpus unit, requests.bitfusion.io/gpu: 2 is
// two whole GPUs.
func TestQuotaInGPUs(t *testing.T) {
	e := newEnv(t, kube.UnitGPUs)
	e.create(resourceQuota("gpus", "2"))
	e.run()
	eventually(t, "the quota is two GPUs", func() bool { q, ok := e.quotaOf(); return ok && q == allocator.ShareGPUs(2) })
}

// TestQuotaInSlicesOfMemory: in the articles' unit, slices of 8Gi of
// 80Gi GPUs, requests.bitfusion.io/gpu: 32 is 3.2 GPUs' worth.
func TestQuotaInSlicesOfMemory(t *testing.T) {
	e := newEnv(t, kube.MemoryUnit(8<<30))
	e.create(resourceQuota("slices", "32"))
	e.run()
	eventually(t, "the quota is 3.2 GPUs", func() bool { q, ok := e.quotaOf(); return ok && q == allocator.SharePercent(320) })
}

// TestQuotaResyncOnStart: a ResourceQuota deleted while the controller was
// down takes the allocator's quota with it when it starts.
func TestQuotaResyncOnStart(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	if err := e.admin.SetQuota(e.ctx, namespace, allocator.SharePercent(200)); err != nil {
		t.Fatal(err)
	}
	e.run()
	eventually(t, "the quota without a ResourceQuota is gone", func() bool { _, ok := e.quotaOf(); return !ok })
}

// TestQuotaIgnoresStatusUpdates: the status kube-apiserver updates with
// every pod a ResourceQuota counts does not write the allocator's quota.
func TestQuotaIgnoresStatusUpdates(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	rq := resourceQuota("q", "100")
	e.create(rq)
	e.run()
	reconciled := func() float64 {
		return testutil.ToFloat64(e.ctrl.metrics.reconciles.WithLabelValues(string(kindQuota), resultSuccess))
	}
	eventually(t, "the quota is set", func() bool { return reconciled() == 1 })
	rq.Status.Used = corev1.ResourceList{requestsGPU: resource.MustParse("50")}
	if _, err := e.kube.CoreV1().ResourceQuotas(namespace).UpdateStatus(e.ctx, rq, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Items are reconciled in order: once team-b's quota is, team-a's
	// status update would have been.
	e.create(namespacedQuota("team-b", "q", "200"))
	eventually(t, "team-b's quota is set", func() bool { _, ok := e.namespaceQuota("team-b"); return ok && reconciled() >= 2 })
	if got := reconciled(); got != 2 {
		t.Errorf("%v quota reconciles, want 2 (team-a's quota, team-b's; not team-a's status)", got)
	}
}

// TestQuotaRefusedIsTold: a ResourceQuota the allocator refuses as a
// quota gets a Warning Event saying why.
func TestQuotaRefusedIsTold(t *testing.T) {
	e := newEnv(t, kube.UnitGPUs)
	e.create(resourceQuota("huge", "2000000"))
	e.run()
	eventually(t, "the quota is reconciled", func() bool {
		return testutil.ToFloat64(e.ctrl.metrics.reconciles.WithLabelValues(string(kindQuota), resultSuccess)) == 1
	})
	wantEvents(t, e.events, "Warning QuotaNotApplied the allocator refused requests.bitfusion.io/gpu 2M as namespace team-a's GPU quota: hardPercent 200000000 out of range")
}

// TestQuotaWithoutRequestsPrefix: the articles' `kubectl create quota
// bf-gpu --hard=bitfusion.io/gpu=32`, which kube-apiserver takes and
// enforces nothing of, is the namespace's quota all the same, and its
// ResourceQuota says which form kube-apiserver enforces. With both forms,
// the least wins.
func TestQuotaWithoutRequestsPrefix(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	bare := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "bf-gpu", Namespace: namespace},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{bareGPU: resource.MustParse("32")}}}
	e.create(bare)
	e.run()
	quotaIs := func(want allocator.Share) func() bool {
		return func() bool { q, ok := e.quotaOf(); return ok && q == want }
	}
	eventually(t, "the quota is 32%", quotaIs(allocator.SharePercent(32)))
	wantEvents(t, e.events, "Warning QuotaEnforcedByPoolOnly bitfusion.io/gpu=32: kube-apiserver does not enforce it (it enforces requests.bitfusion.io/gpu for an extended resource) and admits pods past it; gpupool enforces it when it places them, as namespace team-a's GPU quota")

	e.create(resourceQuota("prefixed", "20"))
	eventually(t, "the least of both forms, 20%", quotaIs(allocator.SharePercent(20)))
	if err := e.kube.CoreV1().ResourceQuotas(namespace).Delete(e.ctx, "prefixed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the bare form's 32% again", quotaIs(allocator.SharePercent(32)))
}

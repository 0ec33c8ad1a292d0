package leases

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/kubetest"
)

// TestResyncOnStart: what happened while the controller was down is
// repaired when it starts: the leases of pods deleted or ended meanwhile
// are released, a bound pod whose lease the allocator lost gets one again
// on its node (or a Warning Event when its node cannot hold it), and the
// leases of running pods stay.
func TestResyncOnStart(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	running := gpuPod("running", "s1", 50)
	runningLease := e.place(running)
	orphan := e.acquire(gpuPod("deleted-meanwhile", "s1", 50))
	done := gpuPod("done", "s2", 50)
	done.Status.Phase = corev1.PodSucceeded
	doneLease := e.place(done)
	lost := gpuPod("lost", "s2", 50)
	lostLease := e.place(lost)
	if err := e.admin.Release(e.ctx, lostLease.ID); err != nil {
		t.Fatal(err)
	}
	tooBig := gpuPod("too-big", "s1", 0)
	tooBig.Annotations[kube.AnnotationRequest] = kube.Request{GPUAmount: 4}.Annotation()
	e.create(tooBig)

	e.run()
	if e.leaseExists(orphan.ID) || e.leaseExists(doneLease.ID) {
		t.Error("the orphan or the ended pod's lease is still there")
	}
	if !e.leaseExists(runningLease.ID) {
		t.Error("the running pod's lease was released")
	}
	if got := e.released(reasonPodDeleted) + e.released(reasonPodSucceeded); got != 2 {
		t.Errorf("releases by pod_deleted and pod_succeeded = %v, want 2", got)
	}
	ls := e.podLeases(lost.UID)
	if len(ls) != 1 {
		t.Fatalf("the pod whose lease was lost holds %d leases, want 1", len(ls))
	}
	again := ls[0]
	if again.Server != "s2" || !again.UntilReleased {
		t.Errorf("the lost lease came back as %+v, want an until-released lease on s2", again)
	}
	pod, err := e.kube.CoreV1().Pods(namespace).Get(e.ctx, lost.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := pod.Annotations[kube.AnnotationLease]; got != again.ID {
		t.Errorf("the pod names lease %q, want the new %s", got, again.ID)
	}
	wantEvents(t, e.events,
		"Normal LeaseRestored lease "+again.ID+" acquired again on node s2",
		"Warning LeaseNotRestored the pod's lease is gone and cannot be acquired again on node s1: no server has 4 free GPUs")
}

// TestResyncConfirmsAMissWithTheAPI: a lease acquired for a pod that the
// cache does not show yet stays.
func TestResyncConfirmsAMissWithTheAPI(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	e.run()
	pod := gpuPod("new", "s1", 50)
	l := e.place(pod)
	eventually(t, "the cache shows the pod bound", func() bool {
		cached, ok, _ := e.ctrl.pods.GetStore().Get(pod)
		return ok && cached.(*corev1.Pod).Annotations[kube.AnnotationLease] == l.ID
	})
	if err := e.ctrl.pods.GetStore().Delete(pod); err != nil { // as if the cache lagged
		t.Fatal(err)
	}
	if err := e.ctrl.resync(e.ctx, false); err != nil {
		t.Fatal(err)
	}
	if !e.leaseExists(l.ID) {
		t.Error("the resync released the lease of a pod the cache did not show yet")
	}
}

// wantEvents checks that each wanted Event was recorded (as the start of
// one Event's text).
func wantEvents(t *testing.T, events *record.FakeRecorder, want ...string) {
	t.Helper()
	var got []string
	for len(events.Events) > 0 {
		got = append(got, <-events.Events)
	}
	for _, w := range want {
		found := false
		for _, g := range got {
			found = found || strings.HasPrefix(g, w)
		}
		if !found {
			t.Errorf("no Event %q among %q", w, got)
		}
	}
}

// TestResyncReleasesLeasesOnDeletedNodes: a node deleted while the
// controller was down has the leases on it released when it starts.
func TestResyncReleasesLeasesOnDeletedNodes(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	onS1, onS2 := e.place(gpuPod("a", "s1", 50)), e.place(gpuPod("b", "s2", 50))
	e.deleteNode("s1")
	e.run()
	if got := e.released(reasonNodeDeleted); got != 1 {
		t.Errorf("releases by node_deleted = %v, want 1", got)
	}
	if e.leaseExists(onS1.ID) || !e.leaseExists(onS2.ID) {
		t.Error("the lease on the deleted node is there, or the one on the other node was released")
	}
}

// TestRestoreForAPodGoneMeanwhile: a pod deleted while its lost lease is
// acquired again does not leave the new lease behind.
func TestRestoreForAPodGoneMeanwhile(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	pod := gpuPod("lost", "s1", 50)
	if err := e.admin.Release(e.ctx, e.place(pod).ID); err != nil {
		t.Fatal(err)
	}
	e.kube.PrependReactor("patch", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(corev1.Resource("pods"), pod.Name)
	})
	e.run()
	if ls := e.podLeases(pod.UID); len(ls) != 0 {
		t.Errorf("the gone pod holds %v", ls)
	}
	if got := e.released(reasonPodDeleted); got != 1 {
		t.Errorf("releases by pod_deleted = %v, want 1", got)
	}
}

// TestRestoreKeepsAHeldLease: a resync may find a pod without a lease
// because the pod was bound after the resync listed the leases. Acquiring
// again then returns the lease the pod holds, or a conflict if the pod's
// labels changed since; either way nothing is written or told.
func TestRestoreKeepsAHeldLease(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	e.run()
	pod := gpuPod("bound", "s1", 50)
	l := e.place(pod)
	if err := e.ctrl.restore(e.ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Labels["app"] = "relabelled"
	if err := e.ctrl.restore(e.ctx, pod); err != nil {
		t.Fatal(err)
	}
	if ls := e.podLeases(pod.UID); len(ls) != 1 || ls[0].ID != l.ID {
		t.Errorf("the pod holds %v, want its lease %s alone", ls, l.ID)
	}
	if n := len(e.events.Events); n > 0 {
		t.Errorf("%d Events written, first %q", n, <-e.events.Events)
	}
	for _, outcome := range []string{outcomeGranted, outcomeRefused} {
		if got := testutil.ToFloat64(e.ctrl.metrics.reacquisitions.WithLabelValues(outcome)); got != 0 {
			t.Errorf("reacquisitions %s = %v, want 0", outcome, got)
		}
	}
}

// TestResyncReleasesLeasesOfPodsNeverBound: every resync, not only the
// one at start, releases a lease whose pod is still not bound the timeout
// after its grant (its scheduling cycle died with kube-scheduler, whose
// wait for the bind was in memory); one younger stays, its bind may yet
// come.
func TestResyncReleasesLeasesOfPodsNeverBound(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	// Long enough that the young lease is younger still when the resync
	// reads it, however slow the machine.
	e.ctrl.unboundTimeout = 2 * time.Second
	e.run()
	stale := gpuPod("stale", "", 50)
	e.create(stale)
	staleLease := kubetest.Acquire(e.ctx, t, e.admin, stale, "s1")
	time.Sleep(e.ctrl.unboundTimeout + 100*time.Millisecond)
	young := gpuPod("young", "", 50)
	e.create(young)
	youngLease := kubetest.Acquire(e.ctx, t, e.admin, young, "s2")
	if err := e.ctrl.resync(e.ctx, false); err != nil {
		t.Fatal(err)
	}
	if e.leaseExists(staleLease.ID) || !e.leaseExists(youngLease.ID) {
		t.Errorf("after a periodic resync the stale lease is there (%v) or the young one gone (%v)", e.leaseExists(staleLease.ID), !e.leaseExists(youngLease.ID))
	}
	if got := e.released(reasonPodUnbound); got != 1 {
		t.Errorf("releases by pod_unbound = %v, want 1", got)
	}
}

// TestResyncAtStartReleasesUnboundLeasesSooner: where this process serves
// the extender, whose waits for binds it lost when it restarted, the
// resync at start releases a lease whose pod is unbound past the
// extender's wait; the periodic ones wait the whole timeout.
func TestResyncAtStartReleasesUnboundLeasesSooner(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	e.ctrl.unboundTimeout, e.ctrl.startUnboundTimeout = time.Hour, 500*time.Millisecond
	lost := gpuPod("lost", "", 50)
	e.create(lost)
	lostLease := kubetest.Acquire(e.ctx, t, e.admin, lost, "s1")
	time.Sleep(e.ctrl.startUnboundTimeout + 100*time.Millisecond)
	e.run()
	if e.leaseExists(lostLease.ID) {
		t.Error("the resync at start left the lease of a pod unbound past the extender's wait")
	}
	waiting := gpuPod("waiting", "", 50)
	e.create(waiting)
	waitingLease := kubetest.Acquire(e.ctx, t, e.admin, waiting, "s2")
	time.Sleep(e.ctrl.startUnboundTimeout + 100*time.Millisecond)
	if err := e.ctrl.resync(e.ctx, false); err != nil {
		t.Fatal(err)
	}
	if !e.leaseExists(waitingLease.ID) {
		t.Error("a periodic resync released a lease younger than its timeout")
	}
}

// TestResyncKeepsTheLeaseOfAPodJustBound: the cache may show a pod unbound
// an instant after its bind; kube-apiserver, asked before the release,
// says it is bound, and its lease stays.
func TestResyncKeepsTheLeaseOfAPodJustBound(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	e.ctrl.unboundTimeout = 500 * time.Millisecond
	e.run()
	pod := gpuPod("binding", "", 50)
	e.create(pod)
	l := kubetest.Acquire(e.ctx, t, e.admin, pod, "s1")
	time.Sleep(e.ctrl.unboundTimeout + 100*time.Millisecond)
	unbound := pod.DeepCopy()
	pod.Spec.NodeName = "s1"
	e.update(pod)
	eventually(t, "the cache shows the pod bound", func() bool {
		cached, ok, _ := e.ctrl.pods.GetStore().Get(pod)
		return ok && cached.(*corev1.Pod).Spec.NodeName == "s1"
	})
	if err := e.ctrl.pods.GetStore().Update(unbound); err != nil { // as if the cache lagged
		t.Fatal(err)
	}
	if err := e.ctrl.resync(e.ctx, false); err != nil {
		t.Fatal(err)
	}
	if !e.leaseExists(l.ID) {
		t.Error("the resync released the lease of a pod bound an instant ago")
	}
}

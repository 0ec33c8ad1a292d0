package leases

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/allocator/service/servicetest"
	"github.com/gpupool/gpupool/internal/metricstest"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/kubetest"
)

const namespace = "team-a"

// testEnv is a cluster (a fake clientset) of GPU-server nodes s1 and s2,
// registered in a real allocator with two GPUs each. The controller's
// allocator client tries once, as the test's does: an outage shows at once.
type testEnv struct {
	t      *testing.T
	ctx    context.Context
	kube   *fake.Clientset
	alloc  *servicetest.Allocator
	admin  *client.Client
	events *record.FakeRecorder
	reg    *prometheus.Registry
	log    *logLines
	ctrl   *Controller
}

func newEnv(t *testing.T, unit kube.Unit) *testEnv {
	t.Helper()
	e := &testEnv{t: t, ctx: t.Context(), kube: fake.NewClientset(), alloc: servicetest.Start(t, nil),
		events: record.NewFakeRecorder(100), reg: prometheus.NewRegistry(), log: &logLines{}}
	e.admin = e.alloc.Client(t)
	e.alloc.Register(t, []api.Server{servicetest.Server("s1", 2), servicetest.Server("s2", 2)})
	for _, name := range []string{"s1", "s2"} {
		e.create(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	}
	var err error
	e.ctrl, err = NewController(Config{Client: e.kube, Allocator: e.alloc.Client(t), Unit: unit, GPUMemoryBytes: 80 << 30, Resync: time.Hour,
		Recorder: e.events, Logger: slog.New(slog.NewTextHandler(e.log, nil)), Registry: e.reg})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// run runs the controller until the test ends and waits until its start
// resync is done.
func (e *testEnv) run() {
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error)
	go func() { done <- e.ctrl.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Error(err)
		}
	})
	e.resynced()
}

func (e *testEnv) create(obj any) {
	e.t.Helper()
	var err error
	switch o := obj.(type) {
	case *corev1.Node:
		_, err = e.kube.CoreV1().Nodes().Create(e.ctx, o, metav1.CreateOptions{})
	case *corev1.Pod:
		_, err = e.kube.CoreV1().Pods(o.Namespace).Create(e.ctx, o, metav1.CreateOptions{})
	case *corev1.ResourceQuota:
		_, err = e.kube.CoreV1().ResourceQuotas(o.Namespace).Create(e.ctx, o, metav1.CreateOptions{})
	}
	if err != nil {
		e.t.Fatal(err)
	}
}

// gpuPod is a pod of team-a that the webhook handled, asking one GPU at
// percent, bound to node.
func gpuPod(name, node string, percent int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, UID: types.UID(name + "-uid"),
			Labels:      map[string]string{"app": "train"},
			Annotations: map[string]string{kube.AnnotationRequest: kube.Request{GPUAmount: 1, GPUPercent: percent}.Annotation()}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

// acquire takes the pod's lease on its node as the scheduler extender
// does, and writes it on the pod.
func (e *testEnv) acquire(pod *corev1.Pod) api.Lease {
	e.t.Helper()
	return kubetest.Acquire(e.ctx, e.t, e.admin, pod, pod.Spec.NodeName)
}

// place creates the pod, then acquires its lease and writes it on the
// pod, as the scheduler places a pod.
func (e *testEnv) place(pod *corev1.Pod) api.Lease {
	e.t.Helper()
	e.create(pod)
	l := e.acquire(pod)
	e.update(pod)
	return l
}

func (e *testEnv) update(pod *corev1.Pod) {
	e.t.Helper()
	if _, err := e.kube.CoreV1().Pods(pod.Namespace).Update(e.ctx, pod, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *testEnv) deletePod(name string) {
	e.t.Helper()
	if err := e.kube.CoreV1().Pods(namespace).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *testEnv) deleteNode(name string) {
	e.t.Helper()
	if err := e.kube.CoreV1().Nodes().Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *testEnv) leaseExists(id string) bool {
	e.t.Helper()
	_, err := e.admin.Lease(e.ctx, id)
	if err != nil && !client.IsReason(err, api.ReasonNotFound) {
		e.t.Fatal(err)
	}
	return err == nil
}

// podLeases are the live leases of the pod with that UID.
func (e *testEnv) podLeases(uid types.UID) []api.Lease {
	e.t.Helper()
	ls, err := e.admin.Leases(e.ctx, client.LeaseFilter{OwnerUID: string(uid)})
	if err != nil {
		e.t.Fatal(err)
	}
	return ls
}

// resynced waits until the controller's start resync is done.
func (e *testEnv) resynced() {
	e.t.Helper()
	eventually(e.t, "the start resync is done", func() bool {
		return testutil.ToFloat64(e.ctrl.metrics.reconciles.WithLabelValues(string(kindResync), resultSuccess)) > 0
	})
}

func (e *testEnv) released(reason string) float64 {
	return testutil.ToFloat64(e.ctrl.metrics.releases.WithLabelValues(reason))
}

// eventually polls until cond holds, failing the test after a deadline
// far beyond what the condition needs.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// logLines keeps what the controller logs, one line per write as slog's
// text handler writes, while the test reads it.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, string(p))
	return len(p), nil
}

// count is how many lines contain s.
func (l *logLines) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

func TestPodDeletionReleasesItsLease(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	e.run()
	gone, stays := gpuPod("gone", "s1", 50), gpuPod("stays", "s1", 50)
	goneLease, staysLease := e.place(gone), e.place(stays)
	e.deletePod(gone.Name)
	eventually(t, "the deleted pod's lease is released", func() bool { return e.released(reasonPodDeleted) == 1 })
	if e.leaseExists(goneLease.ID) || !e.leaseExists(staysLease.ID) {
		t.Error("the deleted pod's lease is there, or the other pod's lease was released too")
	}
}

// TestDeletionSparesALeaseThePodDoesNotOwn: a pod whose annotation names
// another pod's lease (an allocator that lost its store counts lease IDs
// again) has its own lease released, and the other pod keeps its.
func TestDeletionSparesALeaseThePodDoesNotOwn(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	e.run()
	other := e.place(gpuPod("other", "s1", 50))
	pod := gpuPod("stale", "s2", 50)
	e.create(pod)
	own := e.acquire(pod)
	pod.Annotations[kube.AnnotationLease] = other.ID
	e.update(pod)
	e.deletePod(pod.Name)
	eventually(t, "the deleted pod's lease is released", func() bool { return e.released(reasonPodDeleted) == 1 })
	if e.leaseExists(own.ID) || !e.leaseExists(other.ID) {
		t.Error("the deleted pod's own lease is there, or the lease its annotation named was released")
	}
}

// TestUnboundPodDeletionReleasesItsLease: a pod deleted between the
// scheduler's filter (which acquired its lease) and its bind has no
// lease annotation; its lease is found by its UID.
func TestUnboundPodDeletionReleasesItsLease(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	e.run()
	pod := gpuPod("pending", "", 50)
	req, err := kube.LeaseRequest(pod, []string{"s1", "s2"})
	if err != nil {
		t.Fatal(err)
	}
	l, err := e.admin.Acquire(e.ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	e.create(pod)
	e.deletePod(pod.Name)
	eventually(t, "the unbound pod's lease is released", func() bool { return !e.leaseExists(l.ID) })
}

func TestEndedPodReleasesItsLease(t *testing.T) {
	for phase, reason := range map[corev1.PodPhase]string{corev1.PodSucceeded: reasonPodSucceeded, corev1.PodFailed: reasonPodFailed} {
		t.Run(string(phase), func(t *testing.T) {
			e := newEnv(t, kube.UnitPercent)
			e.run()
			pod := gpuPod("job", "s2", 100)
			l := e.place(pod)
			pod.Status.Phase = phase
			if _, err := e.kube.CoreV1().Pods(namespace).UpdateStatus(e.ctx, pod, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the ended pod's lease is released", func() bool { return e.released(reason) == 1 })
			if e.leaseExists(l.ID) {
				t.Errorf("the lease of the %s pod is still there", phase)
			}
		})
	}
}

func TestNodeDeletionReleasesItsLeases(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	e.run()
	onS1 := []api.Lease{e.place(gpuPod("a", "s1", 50)), e.place(gpuPod("b", "s1", 50))}
	onS2 := e.place(gpuPod("c", "s2", 50))
	e.deleteNode("s1")
	eventually(t, "the leases on the deleted node are released", func() bool { return e.released(reasonNodeDeleted) == 2 })
	if e.leaseExists(onS1[0].ID) || e.leaseExists(onS1[1].ID) {
		t.Error("a lease on the deleted node is still there")
	}
	// The pods stay until Kubernetes deletes them with their node; a
	// resync meanwhile must not give them leases on it again.
	if err := e.ctrl.resync(e.ctx, false); err != nil {
		t.Fatal(err)
	}
	if ls := e.podLeases("a-uid"); len(ls) != 0 {
		t.Errorf("a pod of the deleted node holds %v again after a resync", ls)
	}
	// A node's deletion handled once the node is back under its name
	// leaves its leases alone.
	if err := e.ctrl.releaseNode(e.ctx, "s2"); err != nil {
		t.Fatal(err)
	}
	if !e.leaseExists(onS2.ID) {
		t.Error("the lease on the existing node was released")
	}
}

// TestAllocatorOutage: a pod deleted while the allocator is down has its
// lease released once the allocator is back; the outage is logged once.
func TestAllocatorOutage(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	e.run()
	pod := gpuPod("trainer", "s1", 50)
	l := e.place(pod)
	e.alloc.Stop()
	e.deletePod(pod.Name)
	failed := func() float64 {
		return testutil.ToFloat64(e.ctrl.metrics.reconciles.WithLabelValues(string(kindPod), resultError))
	}
	eventually(t, "the release failed twice", func() bool { return failed() >= 2 })
	e.alloc.Restart()
	eventually(t, "the lease is released once the allocator is back", func() bool { return e.released(reasonPodDeleted) == 1 })
	if e.leaseExists(l.ID) {
		t.Error("the lease is still there")
	}
	if down, up := e.log.count("allocator unreachable"), e.log.count("allocator reachable again"); down != 1 || up != 1 {
		t.Errorf("the outage's start was logged %d times and its end %d, want once each", down, up)
	}
}

func TestNewControllerChecksItsConfig(t *testing.T) {
	alloc, err := client.New([]string{"http://127.0.0.1:1"}, servicetest.AdminToken)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Allocator: alloc, Unit: kube.UnitPercent}, "leases: no Kubernetes client"},
		{Config{Client: fake.NewClientset(), Unit: kube.UnitPercent}, "leases: no allocator client"},
		{Config{Client: fake.NewClientset(), Allocator: alloc, Unit: "GPU"}, `leases: unit "GPU": must be one of percent, gpus, memory:<size>`},
		{Config{Client: fake.NewClientset(), Allocator: alloc, Unit: kube.MemoryUnit(8 << 30)},
			"leases: unit memory:8Gi counts GPU memory, and no GPU memory says how much of a GPU a quota is"},
	} {
		if _, err := NewController(c.cfg); err == nil || err.Error() != c.want {
			t.Errorf("NewController(%+v) = %v, want %q", c.cfg, err, c.want)
		}
	}
}

func TestMetricsDocumented(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	e.ctrl.metrics.reconciled(kindResync, nil)
	e.ctrl.metrics.releases.WithLabelValues(reasonPodDeleted).Inc()
	e.ctrl.metrics.reacquisitions.WithLabelValues(outcomeGranted).Inc()
	metricstest.Documented(t, "../../docs/metrics.md", "Lease controller", MetricFamilies, e.reg)
}

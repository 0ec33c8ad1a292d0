package deviceplugin

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/allocator/service/servicetest"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/kubetest"
)

const node = "node-1"

// testEnv is node-1, a GPU server with two A100s registered in a real
// allocator, in a cluster (a fake clientset), with a fake kubelet whose
// device-plugin directory is dir.
type testEnv struct {
	t       *testing.T
	ctx     context.Context
	unit    kube.Unit
	kube    *fake.Clientset
	alloc   *servicetest.Allocator
	admin   *client.Client
	kubelet *fakeKubelet
	dir     string
	created int
	// maxDevices is the plugin's Config.MaxDevices.
	maxDevices int
}

func newEnv(t *testing.T, unit kube.Unit) *testEnv {
	t.Helper()
	// A Unix socket's path has at most 107 bytes: not under t.TempDir,
	// which names the test.
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	e := &testEnv{t: t, ctx: t.Context(), unit: unit, kube: fake.NewClientset(), alloc: servicetest.Start(t, nil), dir: dir}
	e.admin = e.alloc.Client(t)
	e.alloc.Register(t, []api.Server{servicetest.Server(node, 2)})
	e.kubelet = startKubelet(t, dir)
	return e
}

// startPlugin runs a plugin for node-1, as its DaemonSet does, until stop
// or the end of the test.
func (e *testEnv) startPlugin() (p *Plugin, stop func()) {
	e.t.Helper()
	alloc, err := client.New([]string{e.alloc.URL}, servicetest.AdminToken)
	if err != nil {
		e.t.Fatal(err)
	}
	alloc.Retries = 1
	p, err = New(Config{Node: node, Unit: e.unit, MaxDevices: e.maxDevices, Allocator: alloc, Kube: e.kube, Dir: e.dir,
		PodResources: e.kubelet.podResources, Poll: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(e.t.Output(), nil))})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				e.t.Error(err)
			}
		}
	}
	e.t.Cleanup(stop)
	return p, stop
}

// registered starts a plugin and waits until it has registered and sent
// node-1's devices.
func (e *testEnv) registered() (p *Plugin, stop func()) {
	e.t.Helper()
	p, stop = e.startPlugin()
	e.kubelet.waitRegistered()
	e.waitAllDevices()
	return p, stop
}

// waitAllDevices waits until the kubelet has every device of node-1's
// two GPUs.
func (e *testEnv) waitAllDevices() {
	e.t.Helper()
	want := 2 * int(e.unit.PerGPU(80<<30))
	e.kubelet.waitDevices(fmt.Sprintf("%d devices", want), func(d []*pluginapi.Device) bool { return len(d) == want })
}

// gpuPod is a pod of namespace ml as the webhook leaves it, asking for
// amount GPUs at percent (0: whole), not yet bound.
func (e *testEnv) gpuPod(name string, amount, percent int) *corev1.Pod {
	e.created++
	units := int64(amount) * e.unit.PerGPU(80<<30)
	if percent > 0 {
		units = int64(amount * percent)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml", UID: types.UID(name + "-uid"),
			CreationTimestamp: metav1.NewTime(time.Unix(int64(e.created), 0)),
			Annotations:       map[string]string{kube.AnnotationRequest: kube.Request{GPUAmount: amount, GPUPercent: percent}.Annotation()}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{kube.ResourceGPU: *resource.NewQuantity(units, resource.DecimalSI)}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
}

// bind places pod on node-1 as the scheduler extender does: its lease
// acquired with the pod as owner, then the pod bound with the lease's
// annotations. A pod not yet created is created so.
func (e *testEnv) bind(pod *corev1.Pod) api.Lease {
	e.t.Helper()
	l := kubetest.Acquire(e.ctx, e.t, e.admin, pod, node)
	pod.Spec.NodeName = node
	_, err := e.kube.CoreV1().Pods(pod.Namespace).Get(e.ctx, pod.Name, metav1.GetOptions{})
	if err == nil {
		_, err = e.kube.CoreV1().Pods(pod.Namespace).Update(e.ctx, pod, metav1.UpdateOptions{})
	} else {
		_, err = e.kube.CoreV1().Pods(pod.Namespace).Create(e.ctx, pod, metav1.CreateOptions{})
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return l
}

// place binds a new pod asking for amount GPUs at percent, and waits
// until the plugin has seen it bound.
func (e *testEnv) place(p *Plugin, name string, amount, percent int) api.Lease {
	e.t.Helper()
	pod := e.gpuPod(name, amount, percent)
	l := e.bind(pod)
	e.seen(p, pod)
	return l
}

func (e *testEnv) create(pod *corev1.Pod) {
	e.t.Helper()
	if _, err := e.kube.CoreV1().Pods(pod.Namespace).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// seen waits until the plugin's watch has delivered the pods' bindings,
// so that the order it saw them in is the order they were bound in.
func (e *testEnv) seen(p *Plugin, pods ...*corev1.Pod) {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		p.pods.mu.Lock()
		all := !slices.ContainsFunc(pods, func(pod *corev1.Pod) bool { _, ok := p.pods.arrivals[pod.UID]; return !ok })
		p.pods.mu.Unlock()
		if all {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatal("the plugin never saw the pods bound")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// cached waits until the plugin's informer holds the pod key as ok says.
func (e *testEnv) cached(p *Plugin, key string, ok func(*corev1.Pod) bool) {
	e.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if obj, exists, _ := p.pods.informer.GetStore().GetByKey(key); exists && ok(obj.(*corev1.Pod)) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("the plugin never saw pod %s as the test wrote it", key)
		}
	}
}

func (e *testEnv) pod(name string) *corev1.Pod {
	e.t.Helper()
	pod, err := e.kube.CoreV1().Pods("ml").Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return pod
}

// healthyOn counts the healthy devices of a GPU.
func healthyOn(devices []*pluginapi.Device, gpu string) int {
	n := 0
	for _, d := range devices {
		if gpuOf(d.ID) == gpu && d.Health == pluginapi.Healthy {
			n++
		}
	}
	return n
}

// TestRegistersWithThePoolsView: the plugin registers bitfusion.io/gpu
// with a hundred devices per GPU, asks for the kubelet's preferred
// allocation and pre-start calls, and marks a GPU's devices unhealthy when
// its daemon reports it so to the pool.
func TestRegistersWithThePoolsView(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	e.startPlugin()
	req := e.kubelet.waitRegistered()
	if req.ResourceName != kube.ResourceGPU || req.Endpoint != Socket || req.Version != pluginapi.Version ||
		!req.Options.GetPreferredAllocationAvailable || !req.Options.PreStartRequired {
		t.Errorf("registered %+v", req)
	}
	e.kubelet.waitDevices("200 healthy devices", func(d []*pluginapi.Device) bool {
		return len(d) == 200 && healthyOn(d, "GPU-node-1-0") == 100 && healthyOn(d, "GPU-node-1-1") == 100
	})
	if err := e.admin.Heartbeat(e.ctx, node, api.Heartbeat{GPUs: []api.GPUHealth{{Index: 1, Healthy: false}}}); err != nil {
		t.Fatal(err)
	}
	e.kubelet.waitDevices("GPU 1's devices unhealthy", func(d []*pluginapi.Device) bool {
		return len(d) == 200 && healthyOn(d, "GPU-node-1-0") == 100 && healthyOn(d, "GPU-node-1-1") == 0
	})
}

// TestOffersSlicesUpToItsAllocatable: in the articles' unit, two 80Gi GPUs
// are twenty 8Gi slices; with their allocatable of 16, the node offers 16.
func TestOffersSlicesUpToItsAllocatable(t *testing.T) {
	e := newEnv(t, kube.MemoryUnit(8<<30))
	e.startPlugin()
	e.kubelet.waitRegistered()
	e.kubelet.waitDevices("20 slices", func(d []*pluginapi.Device) bool { return len(d) == 20 && healthyOn(d, "GPU-node-1-1") == 10 })
	capped := newEnv(t, kube.MemoryUnit(8<<30))
	capped.maxDevices = 16
	capped.startPlugin()
	capped.kubelet.waitRegistered()
	capped.kubelet.waitDevices("16 slices", func(d []*pluginapi.Device) bool { return len(d) == 16 })
}

// TestRegistersOnceThePoolAnswers: started while the allocator is down,
// the plugin registers once it answers, with the node's GPUs, never with
// no devices, which would make the kubelet refuse the node's GPU pods.
func TestRegistersOnceThePoolAnswers(t *testing.T) {
	e := newEnv(t, kube.UnitGPUs)
	e.alloc.Stop()
	e.startPlugin()
	e.alloc.Restart()
	e.kubelet.waitRegistered()
	if first := <-e.kubelet.updates; len(first) != 2 {
		t.Errorf("first device list: %d devices, want the 2 GPUs", len(first))
	}
}

// TestRegistersAgainWhenTheKubeletRestarts: a restarted kubelet removes
// the plugin's socket and makes its own anew; the plugin serves and
// registers again.
func TestRegistersAgainWhenTheKubeletRestarts(t *testing.T) {
	e := newEnv(t, kube.UnitGPUs)
	e.startPlugin()
	e.kubelet.waitRegistered()
	e.kubelet.restart()
	e.kubelet.waitRegistered()
	e.waitAllDevices()
}

// TestAllocateWholeGPU: in gpus, a pod asking for one GPU gets its lease's
// GPU, which the kubelet was steered to rather than the first it has free,
// and no MPS limits; it is marked allocated, and its container may start.
func TestAllocateWholeGPU(t *testing.T) {
	e := newEnv(t, kube.UnitGPUs)
	p, _ := e.registered()
	// A lease outside Kubernetes (gpupool run on the host) on GPU 0.
	if _, err := e.admin.Acquire(e.ctx, api.AcquireRequest{Namespace: "ml", GPUAmount: 1, GPUPercent: 50, Servers: []string{node}}); err != nil {
		t.Fatal(err)
	}
	l := e.place(p, "train", 1, 0)
	uuid := l.GPUs[0].UUID
	if uuid != "GPU-node-1-1" {
		t.Fatalf("the pool placed the whole GPU on %s, beside the half-GPU lease", uuid)
	}
	ids, resp, err := e.kubelet.allocate(e.ctx, "ml/train", 1)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, []string{uuid}) {
		t.Errorf("the kubelet gave device %q, not the lease's GPU %s", ids, uuid)
	}
	env := resp.Envs
	if env["NVIDIA_VISIBLE_DEVICES"] != uuid || env["GPUPOOL_LEASE_ID"] != l.ID || env["GPUPOOL_GPU_PERCENT"] != "100" {
		t.Errorf("env %v, want lease %s's GPU %s", env, l.ID, uuid)
	}
	if _, ok := env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]; ok {
		t.Errorf("a whole GPU got MPS limits: %v", env)
	}
	if got := e.pod("train").Annotations[kube.AnnotationAllocated]; got != devicesDigest(ids) {
		t.Errorf("pod marked %q, want %q", got, devicesDigest(ids))
	}
	if err := e.kubelet.preStart(e.ctx, ids); err != nil {
		t.Errorf("the container may not start: %v", err)
	}
	// An init container, which the pod-resources API does not list, has
	// nothing to be checked against.
	if err := e.kubelet.preStart(e.ctx, []string{"GPU-node-1-0"}); err != nil {
		t.Errorf("a container the kubelet does not list may not start: %v", err)
	}
}

// TestAllocateFraction: in percent, a pod asking for half of two GPUs
// gets both with MPS's limits, and the kubelet's devices are fifty of
// each of them.
func TestAllocateFraction(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	p, _ := e.registered()
	l := e.place(p, "train", 2, 50)
	ids, resp, err := e.kubelet.allocate(e.ctx, "ml/train", 100)
	if err != nil {
		t.Fatal(err)
	}
	uuids := l.GPUs[0].UUID + "," + l.GPUs[1].UUID
	want := map[string]string{"NVIDIA_VISIBLE_DEVICES": uuids, "CUDA_VISIBLE_DEVICES": uuids, "GPUPOOL_LEASE_ID": l.ID,
		"GPUPOOL_GPU_PERCENT": "50", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=40960M,1=40960M"}
	for k, v := range want {
		if resp.Envs[k] != v {
			t.Errorf("%s=%q, want %q", k, resp.Envs[k], v)
		}
	}
	for _, g := range l.GPUs {
		if n := len(slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return gpuOf(id) != g.UUID })); n != 50 {
			t.Errorf("the kubelet gave %d devices of %s, want 50", n, g.UUID)
		}
	}
}

// TestAllocateTwoPods: pods asking for as many devices get their leases
// in the order they were bound; a pod asking for another number gets its
// own whatever its place; with none left, Allocate fails.
func TestAllocateTwoPods(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	p, _ := e.registered()
	second, first, other := e.gpuPod("second", 1, 25), e.gpuPod("first", 1, 25), e.gpuPod("other", 1, 30)
	leases := map[string]api.Lease{}
	for _, pod := range []*corev1.Pod{other, first, second} {
		leases[pod.Name] = e.bind(pod)
	}
	e.seen(p, other, first, second)
	for _, tc := range []struct {
		pod  string
		size int
	}{{"first", 25}, {"second", 25}, {"other", 30}} {
		_, resp, err := e.kubelet.allocate(e.ctx, "ml/"+tc.pod, tc.size)
		if err != nil {
			t.Fatalf("%s: %v", tc.pod, err)
		}
		if got := resp.Envs["GPUPOOL_LEASE_ID"]; got != leases[tc.pod].ID {
			t.Errorf("%s got lease %s, want its own %s", tc.pod, got, leases[tc.pod].ID)
		}
	}
	_, _, err := e.kubelet.allocate(e.ctx, "ml/third", 25)
	if err == nil || !strings.Contains(err.Error(), "no pod bound to node node-1 with a gpupool.io/lease annotation and not yet allocated asks for 25 bitfusion.io/gpu") {
		t.Errorf("a third allocation: %v", err)
	}
}

// TestAllocateRefusesLeasesNotThePods: a pod whose lease the pool no
// longer has, or whose annotation names another pod's lease, gets an
// error and no GPU, and stays unmarked.
func TestAllocateRefusesLeasesNotThePods(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	p, _ := e.registered()
	l := e.place(p, "gone", 1, 40)
	if err := e.admin.Release(e.ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	_, _, err := e.kubelet.allocate(e.ctx, "ml/gone", 40)
	if err == nil || !strings.Contains(err.Error(), "pod ml/gone's lease "+l.ID+" is no longer in the pool") {
		t.Errorf("a pod whose lease is gone: %v", err)
	}
	if _, marked := e.pod("gone").Annotations[kube.AnnotationAllocated]; marked {
		t.Error("a pod refused its GPU is marked allocated")
	}
	if err := e.kube.CoreV1().Pods("ml").Delete(e.ctx, "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	owner := e.gpuPod("owner", 1, 40)
	ownersLease := e.bind(owner)
	copied := e.gpuPod("copied", 1, 30)
	e.bind(copied)
	copied.Annotations[kube.AnnotationLease] = ownersLease.ID
	if _, err := e.kube.CoreV1().Pods("ml").Update(e.ctx, copied, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.seen(p, owner, copied)
	// The plugin saw copied bound before; wait until it sees the update too.
	e.cached(p, "ml/copied", func(pod *corev1.Pod) bool { return pod.Annotations[kube.AnnotationLease] == ownersLease.ID })
	_, _, err = e.kubelet.allocate(e.ctx, "ml/copied", 30)
	if err == nil || !strings.Contains(err.Error(), "names lease "+ownersLease.ID+", which is pod owner's (UID owner-uid)") {
		t.Errorf("a pod naming another pod's lease: %v", err)
	}

	// A pod bound to this node with its lease on another.
	e.alloc.Register(t, []api.Server{servicetest.Server("node-2", 1)})
	elsewhere := e.gpuPod("elsewhere", 1, 20)
	l2 := kubetest.Acquire(e.ctx, t, e.admin, elsewhere, "node-2")
	elsewhere.Spec.NodeName = node
	e.create(elsewhere)
	e.seen(p, elsewhere)
	_, _, err = e.kubelet.allocate(e.ctx, "ml/elsewhere", 20)
	if err == nil || !strings.Contains(err.Error(), "pod ml/elsewhere's lease "+l2.ID+" is on server node-2, not on this node node-1") {
		t.Errorf("a pod whose lease is on another node: %v", err)
	}
}

// TestRestartedPluginHandsNoLeaseTwice: a pod marked allocated is never
// matched again, by the plugin that marked it or the next.
func TestRestartedPluginHandsNoLeaseTwice(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	p, stop := e.registered()
	e.place(p, "train", 1, 50)
	if _, _, err := e.kubelet.allocate(e.ctx, "ml/train", 50); err != nil {
		t.Fatal(err)
	}
	stop()
	e.registered()
	if _, resp, err := e.kubelet.allocate(e.ctx, "ml/another", 50); err == nil {
		t.Errorf("the restarted plugin handed lease %s again", resp.Envs["GPUPOOL_LEASE_ID"])
	}
}

// TestPreStartRefusesAnotherPodsLease: when the kubelet does not admit a
// pod bound before another asking as many devices, the other's Allocate
// is answered with the first's lease; its container must not start.
func TestPreStartRefusesAnotherPodsLease(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	p, _ := e.registered()
	e.place(p, "rejected", 1, 50)
	e.place(p, "admitted", 1, 50)
	ids, _, err := e.kubelet.allocate(e.ctx, "ml/admitted", 50)
	if err != nil {
		t.Fatal(err)
	}
	err = e.kubelet.preStart(e.ctx, ids)
	if err == nil || !strings.Contains(err.Error(), "pod ml/admitted's GPU container the devices that the device plugin answered with pod ml/rejected's lease") {
		t.Errorf("the container of the admitted pod with the rejected pod's lease may start: %v", err)
	}
}

// TestKubeletRestartAdmitsByCreation: the pods bound when the kubelet
// starts again are admitted in creation order, whatever order they were
// bound in.
func TestKubeletRestartAdmitsByCreation(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	p, _ := e.startPlugin()
	e.kubelet.waitRegistered()
	older, newer := e.gpuPod("older", 1, 50), e.gpuPod("newer", 1, 50)
	e.create(older)
	e.bind(newer)
	e.seen(p, newer)
	olderLease := e.bind(older)
	e.seen(p, older)
	e.kubelet.restart()
	e.kubelet.waitRegistered()
	e.waitAllDevices()
	_, resp, err := e.kubelet.allocate(e.ctx, "ml/older", 50)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Envs["GPUPOOL_LEASE_ID"]; got != olderLease.ID {
		t.Errorf("the first allocation after the kubelet's start got lease %s, want the older pod's %s", got, olderLease.ID)
	}
}

// TestNextAsksTheAPI: a binding the kubelet acts on before the plugin's
// watch delivers it is found in the API.
func TestNextAsksTheAPI(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	pods, err := newPods(e.kube, node) // its informer never started
	if err != nil {
		t.Fatal(err)
	}
	pod := e.gpuPod("train", 1, 50)
	e.bind(pod)
	got, err := pods.next(e.ctx, 50)
	if err != nil || got.Name != "train" {
		t.Errorf("next: %v (%v), want pod train", got, err)
	}
}

// TestMarkedPodIsNotMatchedAgain: a pod this process marked is not matched
// again while the informer still shows it unmarked.
func TestMarkedPodIsNotMatchedAgain(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	pods, err := newPods(e.kube, node) // its informer never started: its cache stays as put
	if err != nil {
		t.Fatal(err)
	}
	pod := e.gpuPod("train", 1, 50)
	e.bind(pod)
	if err := pods.informer.GetStore().Add(pod); err != nil {
		t.Fatal(err)
	}
	got, err := pods.next(e.ctx, 50)
	if err != nil {
		t.Fatal(err)
	}
	if err := pods.markAllocated(e.ctx, got, "0123456789abcdef"); err != nil {
		t.Fatal(err)
	}
	if again, err := pods.next(e.ctx, 50); err == nil {
		t.Errorf("pod %s matched again after it was marked", again.Name)
	}
}

package e2e

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/dra"
	e2ekube "github.com/gpupool/gpupool/test/e2e/kube"
)

// TestDRAClaimsPlacedByThePool: on a control plane running
// gpupool-kube-scheduler as deployed (GPUPool's PreFilter before
// DynamicResources'), with deploy/'s DeviceClass gpu.gpupool.io and
// gpupool-scheduler publishing the pool's GPUs as ResourceSlices, pods
// whose ResourceClaims ask for 8Gi of a GPU are placed by the pool's
// policy: one lease each, on one GPU they share, each claim's allocation
// naming its lease's GPU and memory, reserved for its pod. The
// namespace's quota counts claims as it counts pods; a claim for more
// memory than a GPU has, and one whose allocation a user forged, are
// refused naming the field; a deleted pod and claim end the lease, and
// the claim is deallocated and gone.
func TestDRAClaimsPlacedByThePool(t *testing.T) {
	gpupoolKubeScheduler(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	pool := startKubePool(t, ctx, kubePoolOptions{Namespaces: []string{"ml"}, SchedulerArgs: []string{"--resource-slices-every", "1s"}})
	c := pool.CP.Client
	createDeviceClass(t, ctx, c)
	pool.addNodes(t, ctx, 2, nil, "gpu-0")

	// The slices: gpu-0's two H100s, shareable by memory.
	waitFor(t, func() bool {
		slices, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		return err == nil && len(slices.Items) == 1 && slices.Items[0].Spec.Pool.Name == "gpu-0" && len(slices.Items[0].Spec.Devices) == 2
	})

	// ml's quota: one GPU (percent).
	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "gpus"}, Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"requests." + kube.ResourceGPU: resource.MustParse("100")}}}
	if _, err := c.CoreV1().ResourceQuotas("ml").Create(ctx, quota, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForUpTo(t, 30*time.Second, func() bool {
		qs, err := pool.Admin.Quotas(ctx)
		return err == nil && len(qs) == 1 && qs[0].Namespace == "ml"
	})

	a, claimA := claimPod(t, ctx, pool, "a", claimFor(1, "8Gi"))
	b, claimB := claimPod(t, ctx, pool, "b", claimFor(1, "8Gi"))
	for _, pod := range []*corev1.Pod{a, b} {
		waitForUpTo(t, time.Minute, func() bool { return boundTo(t, ctx, pool, pod) == "gpu-0" })
	}
	var gpu = -1
	for _, pc := range []struct {
		pod   *corev1.Pod
		claim string
	}{{a, claimA}, {b, claimB}} {
		held := pool.leasesOf(t, ctx, pc.pod)
		if len(held) != 1 || len(held[0].GPUs) != 1 || held[0].GPUs[0].MemoryBytes != 8<<30 {
			t.Fatalf("pod %s holds %+v, want one lease of 8Gi of one GPU", pc.pod.Name, held)
		}
		claim := waitClaim(t, ctx, pool, pc.claim, func(c *resourceapi.ResourceClaim) bool { return len(c.Status.ReservedFor) == 1 })
		wantAllocation(t, claim, held[0], pc.pod)
		if gpu != -1 && held[0].GPUs[0].Index != gpu {
			t.Errorf("the two claims of 8Gi are on GPUs %d and %d: the pool packs them on one", gpu, held[0].GPUs[0].Index)
		}
		gpu = held[0].GPUs[0].Index
	}

	// The quota: 20% of one GPU used, a whole one more is past it.
	whole, _ := claimPod(t, ctx, pool, "whole", claimFor(1, ""))
	pool.waitFailedScheduling(t, ctx, whole, "quota")

	// The default scheduler's DRA allocator never takes the pool's GPUs
	// (they are tainted): a share it allocated would hold no lease.
	createClaim(t, ctx, pool, "stray", claimFor(1, "8Gi"))
	stray := claimPodSpec("stray")
	stray.Spec.SchedulerName = ""
	if _, err := c.CoreV1().Pods("ml").Create(ctx, stray, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pool.waitFailedScheduling(t, ctx, stray, "cannot allocate all claims")

	// Bad input, named.
	big, _ := claimPod(t, ctx, pool, "big", claimFor(1, "81Gi"))
	pool.waitFailedScheduling(t, ctx, big, `spec.devices.requests[0].exactly.capacity.requests[memory]: Invalid value: "81Gi": must be 1Mi..80Gi`)
	createClaim(t, ctx, pool, "forged", claimFor(1, "8Gi"))
	forge(t, ctx, pool, "forged")
	forged := createClaimPod(t, ctx, pool, "forged")
	pool.waitFailedScheduling(t, ctx, forged, "status.allocation names GPUs the pool did not lease it")

	// A deleted pod and claim end the lease; the claim is deallocated, its
	// finalizer removed, and gone.
	lease := pool.leasesOf(t, ctx, a)[0]
	if err := c.CoreV1().Pods("ml").Delete(ctx, a.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	if err := c.ResourceV1().ResourceClaims("ml").Delete(ctx, claimA, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForUpTo(t, 30*time.Second, func() bool {
		_, err := pool.Admin.Lease(ctx, lease.ID)
		return err != nil
	})
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		claim, err := c.ResourceV1().ResourceClaims("ml").Get(ctx, claimA, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("claim a, its pod deleted and itself deleted a minute ago: %v, finalizers %v, reserved for %+v, allocated %v", err, claim.Finalizers, claim.Status.ReservedFor, claim.Status.Allocation != nil)
		}
	}
	if held := pool.leasesOf(t, ctx, b); len(held) != 1 {
		t.Errorf("pod b holds %d leases after a's went, want its own", len(held))
	}
}

// createDeviceClass creates deploy/'s DeviceClass gpu.gpupool.io.
func createDeviceClass(t testing.TB, ctx context.Context, c kubernetes.Interface) {
	t.Helper()
	raw, err := os.ReadFile("../../deploy/components/kubernetes/dra.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var class resourceapi.DeviceClass
	if err := yaml.Unmarshal(raw, &class); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ResourceV1().DeviceClasses().Create(ctx, &class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// claimFor is a claim's spec for count GPUs of the pool's class, memory of
// each when not "".
func claimFor(count int64, memory string) resourceapi.ResourceClaimSpec {
	x := &resourceapi.ExactDeviceRequest{DeviceClassName: dra.DeviceClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}
	if memory != "" {
		x.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{dra.CapacityMemory: resource.MustParse(memory)}}
	}
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: x}}}}
}

// claimPod creates, in ml, the claim name of spec and a pod named name
// that uses it.
func claimPod(t *testing.T, ctx context.Context, pool *kubePool, name string, spec resourceapi.ResourceClaimSpec) (*corev1.Pod, string) {
	t.Helper()
	createClaim(t, ctx, pool, name, spec)
	return createClaimPod(t, ctx, pool, name), name
}

func createClaim(t *testing.T, ctx context.Context, pool *kubePool, name string, spec resourceapi.ResourceClaimSpec) {
	t.Helper()
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	if _, err := pool.CP.Client.ResourceV1().ResourceClaims("ml").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// createClaimPod creates, in ml, claimPodSpec(name).
func createClaimPod(t *testing.T, ctx context.Context, pool *kubePool, name string) *corev1.Pod {
	t.Helper()
	pod, err := pool.CP.Client.CoreV1().Pods("ml").Create(ctx, claimPodSpec(name), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// claimPodSpec is a pod that uses claim name, for gpupool-kube-scheduler,
// on the kwok nodes.
func claimPodSpec(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "train"}},
		Spec: corev1.PodSpec{SchedulerName: kube.SchedulerName, Tolerations: []corev1.Toleration{e2ekube.KwokToleration},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(name)}},
			Containers: []corev1.Container{{Name: "trainer", Image: "trainer", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}, Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}}}}
}

// boundTo is the node pod is bound to, "" for none yet.
func boundTo(t *testing.T, ctx context.Context, pool *kubePool, pod *corev1.Pod) string {
	t.Helper()
	got, err := pool.CP.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got.Spec.NodeName
}

// waitClaim waits until ml's claim name satisfies cond, and returns it.
func waitClaim(t *testing.T, ctx context.Context, pool *kubePool, name string, cond func(*resourceapi.ResourceClaim) bool) *resourceapi.ResourceClaim {
	t.Helper()
	var claim *resourceapi.ResourceClaim
	waitFor(t, func() bool {
		var err error
		claim, err = pool.CP.Client.ResourceV1().ResourceClaims("ml").Get(ctx, name, metav1.GetOptions{})
		return err == nil && cond(claim)
	})
	return claim
}

// wantAllocation checks that claim's allocation names exactly the lease's
// GPUs and memory, on its server, reserved for pod, with the finalizer
// that has it deallocated.
func wantAllocation(t *testing.T, claim *resourceapi.ResourceClaim, lease api.Lease, pod *corev1.Pod) {
	t.Helper()
	a := claim.Status.Allocation
	if a == nil || len(a.Devices.Results) != len(lease.GPUs) {
		t.Fatalf("claim %s: allocation %+v, want lease %+v's GPUs", claim.Name, a, lease)
	}
	for i, r := range a.Devices.Results {
		memory := r.ConsumedCapacity[dra.CapacityMemory]
		if r.Driver != dra.DriverName || r.Pool != lease.Server || r.Device != "gpu-"+strconv.Itoa(lease.GPUs[i].Index) || memory.Value() != lease.GPUs[i].MemoryBytes || r.ShareID == nil {
			t.Errorf("claim %s: result %+v, want lease %s's GPU %d on %s", claim.Name, r, lease.ID, lease.GPUs[i].Index, lease.Server)
		}
	}
	if r := claim.Status.ReservedFor; len(r) != 1 || r[0].UID != pod.UID {
		t.Errorf("claim %s reserved for %+v, want pod %s", claim.Name, r, pod.Name)
	}
	if !strings.Contains(strings.Join(claim.Finalizers, ","), resourceapi.Finalizer) {
		t.Errorf("claim %s: finalizers %v, want %s", claim.Name, claim.Finalizers, resourceapi.Finalizer)
	}
}

// forge writes an allocation of gpu-0's GPU 1 on ml's claim name, as a
// user with the right to would, without a lease.
func forge(t *testing.T, ctx context.Context, pool *kubePool, name string) {
	t.Helper()
	claims := pool.CP.Client.ResourceV1().ResourceClaims("ml")
	claim, err := claims.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim.Status.Allocation = dra.Allocation("gpu", api.Lease{ID: "forged", Server: "gpu-0", GPUs: []api.LeaseGPU{{Index: 1, MemoryBytes: 80 << 30}}})
	if _, err := claims.UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestDRAClaimsOnTheKubelet: on a real node (a kubelet over containerd 2,
// which applies CDI specs) whose GPU server has one simulated H100, and
// whose gpupool-device-plugin serves DRA's kubelet plugin, two pods whose
// claims ask for 8Gi of a GPU run with the lease's GPU: their containers
// get the lease's environment (its GPU's UUID, 10% of it for MPS) and its
// device file, through the CDI spec the plugin wrote; the two share the
// one GPU, and each claim's allocation is its pod's lease.
func TestDRAClaimsOnTheKubelet(t *testing.T) {
	gpupoolKubeScheduler(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	np := startNodePool(t, ctx, kubePoolOptions{Namespaces: []string{"ml"}, DRANode: true, SchedulerArgs: []string{"--resource-slices-every", "1s"}}, 1)
	createDeviceClass(t, ctx, np.CP.Client)
	var gpu string
	for _, name := range []string{"a", "b"} {
		createClaim(t, ctx, np.kubePool, name, claimFor(1, "8Gi"))
		pod := claimPodSpec(name)
		pod.Spec.Tolerations = nil
		pod.Spec.TerminationGracePeriodSeconds = ptr.To[int64](5)
		pod.Spec.Containers[0].Image, pod.Spec.Containers[0].ImagePullPolicy = gpuloadImage, corev1.PullIfNotPresent
		if _, err := np.CP.Client.CoreV1().Pods("ml").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		running := np.waitRunning(t, ctx, "ml", name)
		lease := np.checkLeaseEnv(t, ctx, running, 10)
		claim := waitClaim(t, ctx, np.kubePool, name, func(c *resourceapi.ResourceClaim) bool { return len(c.Status.ReservedFor) == 1 })
		wantAllocation(t, claim, lease, running)
		if gpu != "" && lease.GPUs[0].UUID != gpu {
			t.Errorf("the two claims of 8Gi are on GPUs %s and %s of one", gpu, lease.GPUs[0].UUID)
		}
		gpu = lease.GPUs[0].UUID
	}

	// Both ways in, one pool: a pod of the articles' YAML takes half of the
	// GPU through the device plugin, and a claim for the 40Gi that would
	// take more than the 30% left is refused.
	bfk := bfkDeployment(1, 50).Spec.Template
	bfk.Name = "bfk"
	if _, err := np.CP.Client.CoreV1().Pods("ml").Create(ctx, &corev1.Pod{ObjectMeta: bfk.ObjectMeta, Spec: bfk.Spec}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	np.checkLeaseEnv(t, ctx, np.waitRunning(t, ctx, "ml", "bfk"), 50)
	big, _ := claimPod(t, ctx, np.kubePool, "big", claimFor(1, "40Gi"))
	np.waitFailedScheduling(t, ctx, big, "gpupool allocator: no server")
}

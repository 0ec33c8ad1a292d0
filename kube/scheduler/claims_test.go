package scheduler

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/service/servicetest"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/dra"
	"github.com/gpupool/gpupool/kube/scheduler/schedulertest"
)

// newClaimPlacer is a placer that places pods' claims too, on an
// allocator with the servers given.
func newClaimPlacer(t *testing.T, servers ...api.Server) (*testPlacer, *schedulertest.Claims) {
	t.Helper()
	a := servicetest.Start(t, nil)
	a.Register(t, servers)
	te := &testPlacer{alloc: a.Client(t), kube: schedulertest.NewCluster(), reg: prometheus.NewRegistry()}
	claims := &schedulertest.Claims{Cluster: te.kube}
	te.Placer = New(Config{Allocator: te.alloc, Kube: te.kube, Registry: te.reg, Claims: claims})
	return te, claims
}

// claimPod is a pod of no gpupool annotation whose claim, name, asks for
// one GPU of the pool's class, memory of it when not "".
func claimPod(t *testing.T, te *testPlacer, name, memory string) (*v1.Pod, *resourceapi.ResourceClaim) {
	t.Helper()
	x := &resourceapi.ExactDeviceRequest{DeviceClassName: dra.DeviceClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}
	if memory != "" {
		x.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{dra.CapacityMemory: resource.MustParse(memory)}}
	}
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team-a", UID: types.UID("claim-" + name)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: x}}}}}
	claim, err := te.kube.ResourceV1().ResourceClaims("team-a").Create(context.Background(), claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := testPod(name, half)
	pod.Annotations = nil
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(name)}}
	te.kube.Put(t, pod)
	return pod, claim
}

func (te *testPlacer) claim(t *testing.T, name string) *resourceapi.ResourceClaim {
	t.Helper()
	c, err := te.kube.ResourceV1().ResourceClaims("team-a").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestClaimIsAllocatedTheLease: a pod's claim for 8Gi of a GPU is placed
// by the pool as a pod's request is, one lease. Place notes the claim's
// allocation in kube-scheduler's store, reserved for the pod, and writes
// nothing; the bind writes it: exactly the lease's GPU and the memory it
// gives, the reservation, and the finalizer that has the claim
// deallocated when no pod holds it. Two such claims share one GPU; the
// bind takes the same lease again.
func TestClaimIsAllocatedTheLease(t *testing.T) {
	te, claims := newClaimPlacer(t, servicetest.Server("gpu-0", 1))
	for i, name := range []string{"a", "b"} {
		pod, _ := claimPod(t, te, name, "8Gi")
		lease, err := te.Place(context.Background(), pod, nil)
		if err != nil {
			t.Fatalf("Place: %v", err)
		}
		if lease.Server != "gpu-0" || len(lease.GPUs) != 1 || lease.GPUs[0].MemoryBytes != 8<<30 {
			t.Fatalf("lease %+v, want 8Gi of one GPU of gpu-0", lease)
		}
		if written := te.claim(t, name); written.Status.Allocation != nil || len(written.Finalizers) > 0 {
			t.Errorf("claim %s written in the filter: allocation %+v, finalizers %v; want it noted alone", name, written.Status.Allocation, written.Finalizers)
		}
		noted, err := claims.Get("team-a", name)
		if err != nil || !dra.AllocatesLease(noted.Status.Allocation, lease) || !reservedFor(noted, pod) {
			t.Fatalf("claim %s noted: %+v, %v; want the lease's allocation, reserved for the pod", name, noted.Status, err)
		}
		if err := te.callBind(pod, "gpu-0"); err != nil {
			t.Fatalf("bind: %v", err)
		}
		claim := te.claim(t, name)
		a := claim.Status.Allocation
		if a == nil || len(a.Devices.Results) != 1 || a.AllocationTimestamp == nil || !slices.Contains(claim.Finalizers, resourceapi.Finalizer) || !reservedFor(claim, pod) || claims.Assumed() != 2*(i+1) {
			t.Fatalf("claim %s after the bind: %+v, finalizers %v, %d noted", name, claim.Status, claim.Finalizers, claims.Assumed())
		}
		r := a.Devices.Results[0]
		if got := r.ConsumedCapacity[dra.CapacityMemory]; r.Request != "gpu" || r.Driver != dra.DriverName || r.Pool != "gpu-0" || r.Device != "gpu-0" || got.Value() != 8<<30 {
			t.Errorf("claim %s's result %+v, want 8Gi of gpu-0's gpu-0 for request gpu", name, r)
		}
		if held := te.leases(t, pod); len(held) != 1 || held[0].ID != lease.ID {
			t.Errorf("after the bind the pod holds %+v, want %s alone", held, lease.ID)
		}
		// The pod is then one the pool placed, as a pod the webhook handled.
		bound := te.kube.Bindings()[i]
		if got := bound.Annotations[kube.AnnotationRequest]; got != (kube.Request{GPUAmount: 1, GPUMemory: "8589934592"}).Annotation() {
			t.Errorf("the Binding's %s: %q, want the claim's request", kube.AnnotationRequest, got)
		}
	}
}

// reservedFor reports whether the claim is reserved for the pod alone.
func reservedFor(claim *resourceapi.ResourceClaim, pod *v1.Pod) bool {
	r := claim.Status.ReservedFor
	return len(r) == 1 && r[0].UID == pod.UID && r[0].Name == pod.Name && r[0].Resource == "pods"
}

// TestReleaseDeallocatesTheClaim: a lease given back before the bind (the
// pod failed kube-scheduler's other filters) takes the allocation noted
// for its claim with it; given back after the bind wrote the claim (the
// Binding failed), the written allocation, reservation and finalizer go.
func TestReleaseDeallocatesTheClaim(t *testing.T) {
	te, claims := newClaimPlacer(t, servicetest.Server("gpu-0", 1))
	ctx := context.Background()
	pod, _ := claimPod(t, te, "a", "")
	if _, err := te.Place(ctx, pod, nil); err != nil {
		t.Fatal(err)
	}
	te.Release(ctx, pod, "test: the node failed another filter")
	noted, err := claims.Get("team-a", "a")
	if err != nil || noted.Status.Allocation != nil || len(noted.Status.ReservedFor) > 0 || len(te.leases(t, pod)) != 0 {
		t.Errorf("after the release: the store has %+v (%v), %d leases", noted.Status, err, len(te.leases(t, pod)))
	}

	// Written by a bind whose Binding then failed.
	if _, err := te.Place(ctx, pod, nil); err != nil {
		t.Fatal(err)
	}
	c, err := te.claimOf(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	lease := te.leases(t, pod)[0]
	if err := te.writeAllocation(ctx, c, lease, PodRef{pod.Namespace, pod.Name, pod.UID}); err != nil {
		t.Fatal(err)
	}
	if claim := te.claim(t, "a"); !dra.AllocatesLease(claim.Status.Allocation, lease) || !reservedFor(claim, pod) {
		t.Fatalf("written: %+v", claim.Status)
	}
	te.Release(ctx, pod, "test: the Binding failed")
	if claim := te.claim(t, "a"); claim.Status.Allocation != nil || len(claim.Status.ReservedFor) > 0 || slices.Contains(claim.Finalizers, resourceapi.Finalizer) {
		t.Errorf("after the release: %+v, finalizers %v", claim.Status, claim.Finalizers)
	}
}

// TestClaimsThePoolRefuses: a claim the pool did not allocate, another
// pod's claim, a pod's second claim for the pool's GPUs, one asking for
// more memory than a GPU has, and a pod with neither a request nor a claim
// are refused, saying why.
func TestClaimsThePoolRefuses(t *testing.T) {
	te, _ := newClaimPlacer(t, servicetest.Server("gpu-0", 2))
	ctx := context.Background()
	refused := func(pod *v1.Pod, want string) {
		t.Helper()
		lease, err := te.Place(ctx, pod, nil)
		if !Unschedulable(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("Place: %+v, %v; want it refused with %q", lease, err, want)
		}
	}

	forged, claim := claimPod(t, te, "forged", "")
	claim.Status.Allocation = dra.Allocation("gpu", api.Lease{ID: "lease-999999", Server: "gpu-0", GPUs: []api.LeaseGPU{{Index: 1, MemoryBytes: 80 << 30}}})
	if _, err := te.kube.ResourceV1().ResourceClaims("team-a").UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	refused(forged, "ResourceClaim team-a/forged: status.allocation names GPUs the pool did not lease it")

	other, claim := claimPod(t, te, "other", "")
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "someone", UID: "uid-someone"}}
	if _, err := te.kube.ResourceV1().ResourceClaims("team-a").UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	refused(other, "spec.resourceClaims[0]: ResourceClaim team-a/other is reserved for pods someone")

	two, _ := claimPod(t, te, "two", "")
	claimPod(t, te, "second", "")
	two.Spec.ResourceClaims = append(two.Spec.ResourceClaims, v1.PodResourceClaim{Name: "more", ResourceClaimName: ptr.To("second")})
	te.kube.Put(t, two)
	refused(two, "spec.resourceClaims[1]: a second claim for gpu.gpupool.io devices")

	big, _ := claimPod(t, te, "big", "81Gi")
	refused(big, `ResourceClaim team-a/big: spec.devices.requests[0].exactly.capacity.requests[memory]: Invalid value: "81Gi": must be 1Mi..80Gi`)

	plain := testPod("plain", half)
	plain.Annotations = nil
	te.kube.Put(t, plain)
	refused(plain, "no ResourceClaim of DeviceClass gpu.gpupool.io")

	for _, name := range []string{"forged", "other", "two", "big", "plain"} {
		if held := te.leases(t, testPod(name, half)); len(held) > 0 {
			t.Errorf("refused pod %s holds %+v", name, held)
		}
	}
}

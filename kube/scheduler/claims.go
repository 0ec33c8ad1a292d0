package scheduler

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/dra"
)

// ClaimStore reads the ResourceClaims of pods and takes note of the
// allocations the placer makes: kube-scheduler's DRA manager
// (framework.ResourceClaimTracker). An allocation noted before it is
// written lets DynamicResources, after GPUPool in the same cycle, read the
// claim allocated and reserved for the pod: it checks the node and writes
// nothing; the bind writes it, beside kube-scheduler's loop.
type ClaimStore interface {
	Get(namespace, name string) (*resourceapi.ResourceClaim, error)
	AssumeClaimAfterAPICall(claim *resourceapi.ResourceClaim) error
	AssumedClaimRestore(namespace, name string)
}

// podClaim is the pod's claim for the pool's GPUs, read.
type podClaim struct {
	claim *resourceapi.ResourceClaim
	dra.Claim
}

// claimOf finds the pod's claim of DeviceClass gpu.gpupool.io and reads
// it; nil for a pod that has none. A pod's claim whose generated claim
// does not exist yet, or that another pod holds, is refused for now.
func (p *Placer) claimOf(ctx context.Context, pod *v1.Pod) (*podClaim, error) {
	if p.claims == nil || len(pod.Spec.ResourceClaims) == 0 {
		return nil, nil
	}
	var found *podClaim
	for i, pc := range pod.Spec.ResourceClaims {
		path := field.NewPath("spec", "resourceClaims").Index(i)
		name := claimName(pod, pc)
		if name == "" {
			return nil, &refusal{fmt.Sprintf("gpupool: %s: the claim of template %s is not created yet", path, *pc.ResourceClaimTemplateName)}
		}
		claim, err := p.claims.Get(pod.Namespace, name)
		if apierrors.IsNotFound(err) {
			return nil, &refusal{fmt.Sprintf("gpupool: %s: no ResourceClaim %s/%s", path, pod.Namespace, name)}
		} else if err != nil {
			return nil, err
		}
		cat, err := p.catalog.of(ctx, p.alloc)
		if err != nil {
			return nil, err
		}
		read, ours, err := dra.ReadClaim(ctx, claim, cat)
		switch {
		case !ours:
			continue
		case err != nil:
			return nil, &refusal{fmt.Sprintf("gpupool: ResourceClaim %s/%s: %v", pod.Namespace, name, err)}
		case found != nil:
			return nil, &refusal{fmt.Sprintf("gpupool: %s: a second claim for %s devices: the pool places one lease a pod; ask in one claim", path, dra.DeviceClassName)}
		}
		for _, r := range claim.Status.ReservedFor {
			if r.UID != pod.UID {
				return nil, &refusal{fmt.Sprintf("gpupool: %s: ResourceClaim %s/%s is reserved for %s %s: the pool leases a claim's GPUs to one pod", path, pod.Namespace, name, r.Resource, r.Name)}
			}
		}
		found = &podClaim{claim: claim, Claim: read}
	}
	return found, nil
}

// claimName is the name of the pod's claim pc, "" while its template's
// claim is not created.
func claimName(pod *v1.Pod, pc v1.PodResourceClaim) string {
	if pc.ResourceClaimName != nil {
		return *pc.ResourceClaimName
	}
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.Name == pc.Name && s.ResourceClaimName != nil {
			return *s.ResourceClaimName
		}
	}
	return ""
}

// claimRequest is the lease of a pod's claim among servers: the claim's
// request, with the pod's CPU and memory, owned by the pod.
func claimRequest(pod *v1.Pod, c *podClaim, servers []string) api.AcquireRequest {
	return kube.LeaseRequestFor(pod, c.Request, servers)
}

// noteAllocation notes the lease as the claim's allocation, reserved for
// the pod, in kube-scheduler's store, unless the claim has it already; the
// bind writes it (writeAllocation). A claim allocated to other GPUs than
// the lease's is refused: the pool did not place it (a forged allocation,
// or DRA's own allocator).
func (p *Placer) noteAllocation(c *podClaim, lease api.Lease, pod *v1.Pod) error {
	// The store's copy: a replaced lease's allocation may have been
	// cleared since the pod's claim was read.
	claim, err := p.claims.Get(c.claim.Namespace, c.claim.Name)
	if err != nil {
		return fmt.Errorf("gpupool scheduler: ResourceClaim %s/%s: %w", c.claim.Namespace, c.claim.Name, err)
	}
	if a := claim.Status.Allocation; a != nil {
		if dra.AllocatesLease(a, lease) {
			return nil
		}
		return &refusal{fmt.Sprintf("gpupool: ResourceClaim %s/%s: status.allocation names GPUs the pool did not lease it (lease %s is on %s)", claim.Namespace, claim.Name, lease.ID, lease.Server)}
	}
	claim = claim.DeepCopy()
	claim.Status.Allocation = allocationOf(c, lease)
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{reservation(pod.Name, pod.UID)}
	return p.claims.AssumeClaimAfterAPICall(claim)
}

// allocationOf is the lease as the allocation of the pod's claim, stamped
// now: kube-scheduler stamps an allocation without a time as it reserves
// it, and an allocation, once written, cannot change.
func allocationOf(c *podClaim, lease api.Lease) *resourceapi.AllocationResult {
	a := dra.Allocation(c.Name, lease)
	a.AllocationTimestamp = &metav1.Time{Time: time.Now()}
	return a
}

// reservation is a claim's reservation for the pod.
func reservation(name string, uid types.UID) resourceapi.ResourceClaimConsumerReference {
	return resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: name, UID: uid}
}

// writeAllocation writes the lease as the allocation of the pod's claim,
// reserved for the pod, as DynamicResources writes its own allocations in
// its PreBind: the finalizer that has kube-controller-manager deallocate
// the claim once no pod holds it, then the allocation and the reservation
// in one write of the status. The bind calls it, beside kube-scheduler's
// loop; the lease is the bind's, durable (the filter's, or one taken again
// on the node after the allocator lost it). A claim changed meanwhile is
// read again and written on.
func (p *Placer) writeAllocation(ctx context.Context, c *podClaim, lease api.Lease, pod PodRef) error {
	claims := p.kube.ResourceV1().ResourceClaims(c.claim.Namespace)
	claim, read := c.claim, false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if read {
			got, err := claims.Get(ctx, c.claim.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			claim = got
		}
		read = true
		claim = claim.DeepCopy()
		if !slices.Contains(claim.Finalizers, resourceapi.Finalizer) {
			claim.Finalizers = append(claim.Finalizers, resourceapi.Finalizer)
			updated, err := claims.Update(ctx, claim, metav1.UpdateOptions{})
			if err != nil {
				return err
			}
			claim = updated.DeepCopy()
		}
		if a := claim.Status.Allocation; a == nil || !dra.AllocatesLease(a, lease) {
			claim.Status.Allocation = allocationOf(c, lease)
		}
		if !slices.ContainsFunc(claim.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == pod.UID }) {
			claim.Status.ReservedFor = append(claim.Status.ReservedFor, reservation(pod.Name, pod.UID))
		}
		updated, err := claims.UpdateStatus(ctx, claim, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		claim = updated
		return nil
	})
	if err != nil {
		return fmt.Errorf("gpupool scheduler: ResourceClaim %s/%s: writing its allocation: %w", c.claim.Namespace, c.claim.Name, err)
	}
	return p.claims.AssumeClaimAfterAPICall(claim)
}

// deallocate forgets the allocation noted for the pod's claim, and clears
// one written that no other pod holds, with its finalizer: the pod's lease
// was given back before it was bound.
func (p *Placer) deallocate(ctx context.Context, pod *v1.Pod) error {
	c, err := p.claimOf(ctx, pod)
	if c == nil || err != nil {
		return nil // no claim of the pool's, or one another pod holds
	}
	p.claims.AssumedClaimRestore(c.claim.Namespace, c.claim.Name)
	claims := p.kube.ResourceV1().ResourceClaims(c.claim.Namespace)
	// The bind may have written it: kube-apiserver's copy says.
	claim, err := claims.Get(ctx, c.claim.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("ResourceClaim %s/%s: %w", c.claim.Namespace, c.claim.Name, err)
	}
	others := slices.ContainsFunc(claim.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID != pod.UID })
	if claim.Status.Allocation == nil || others {
		return nil
	}
	claim.Status.Allocation, claim.Status.ReservedFor = nil, nil
	updated, err := claims.UpdateStatus(ctx, claim, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("ResourceClaim %s/%s: clearing its allocation: %w", claim.Namespace, claim.Name, err)
	}
	updated = updated.DeepCopy()
	updated.Finalizers = slices.DeleteFunc(updated.Finalizers, func(f string) bool { return f == resourceapi.Finalizer })
	if updated, err = claims.Update(ctx, updated, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("ResourceClaim %s/%s: removing its finalizer: %w", claim.Namespace, claim.Name, err)
	}
	klog.FromContext(ctx).V(2).Info("cleared the allocation of the pod's claim", "pod", pod.Namespace+"/"+pod.Name, "claim", claim.Name)
	return p.claims.AssumeClaimAfterAPICall(updated)
}

// catalogTTL is how long the pool's models are read once for: a claim's
// selectors are matched against them.
const catalogTTL = 30 * time.Second

// catalog is the pool's models, read from the allocator at most once a
// catalogTTL.
type catalog struct {
	mu   sync.Mutex
	read time.Time
	cat  dra.Catalog
}

func (c *catalog) of(ctx context.Context, alloc *client.Client) (dra.Catalog, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cat != nil && time.Since(c.read) < catalogTTL {
		return c.cat, nil
	}
	pool, err := alloc.Pool(ctx)
	if err != nil {
		return nil, fmt.Errorf("gpupool allocator: reading the pool's GPU models: %w", err)
	}
	c.cat, c.read = dra.CatalogOf(pool.Servers), time.Now()
	return c.cat, nil
}

package leases

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/kube"
)

// Why a lease ends: the reasons of bitfusion_lease_controller_releases_total.
const (
	reasonPodDeleted   = "pod_deleted"
	reasonPodSucceeded = "pod_succeeded"
	reasonPodFailed    = "pod_failed"
	reasonNodeDeleted  = "node_deleted"
	reasonPodUnbound   = "pod_unbound"
)

// Reasons of the Events written on pods.
const (
	eventLeaseRestored    = "LeaseRestored"
	eventLeaseNotRestored = "LeaseNotRestored"
)

// endReason says why an ended pod's lease ends; "" while the pod may run.
func endReason(pod *corev1.Pod) string {
	switch pod.Status.Phase {
	case corev1.PodSucceeded:
		return reasonPodSucceeded
	case corev1.PodFailed:
		return reasonPodFailed
	}
	return ""
}

// podLease reports whether the controller ends l: a lease acquired for a
// pod that lives until released. Leases with a TTL (gpupool run's, even
// inside a pod) end by themselves.
func podLease(l *api.Lease) bool {
	return l.UntilReleased && l.Owner.UID != "" && l.Owner.Pod != ""
}

// releasePod releases the lease of the pod with that UID: the one its
// annotation names once the allocator shows it is the pod's (an ID alone
// proves nothing after an allocator lost its store and counts again),
// else those the allocator lists for the pod (acquired in the
// scheduler's filter, the pod deleted before its bind wrote the
// annotation).
func (c *Controller) releasePod(ctx context.Context, namespace string, uid types.UID, annotated, reason string) error {
	if annotated != "" {
		l, err := c.alloc.Lease(ctx, annotated)
		switch {
		case c.reached(err) == nil && l.Owner.UID == string(uid) && podLease(&l):
			return c.release(ctx, &l, reason)
		case err != nil && !client.IsReason(err, api.ReasonNotFound):
			return fmt.Errorf("lease %s: %w", annotated, err)
		}
	}
	ls, err := c.alloc.Leases(ctx, client.LeaseFilter{Namespace: namespace, OwnerUID: string(uid)})
	if err := c.reached(err); err != nil {
		return fmt.Errorf("leases of pod %s: %w", uid, err)
	}
	return c.releaseAll(ctx, ls, reason)
}

// releaseNode releases the pod leases on a deleted node: its pods can
// never run there. A node created again under the name before this runs
// keeps its pods, and they their leases.
func (c *Controller) releaseNode(ctx context.Context, name string) error {
	if _, err := c.nodes.Get(name); err == nil {
		return nil
	}
	ls, err := c.alloc.Leases(ctx, client.LeaseFilter{Server: name})
	if err := c.reached(err); err != nil {
		return fmt.Errorf("leases on node %s: %w", name, err)
	}
	return c.releaseAll(ctx, ls, reasonNodeDeleted)
}

// releaseAll releases the pod leases among ls.
func (c *Controller) releaseAll(ctx context.Context, ls []api.Lease, reason string) error {
	var errs []error
	for i := range ls {
		if podLease(&ls[i]) {
			errs = append(errs, c.release(ctx, &ls[i], reason))
		}
	}
	return errors.Join(errs...)
}

// release ends one lease; one already gone is fine.
func (c *Controller) release(ctx context.Context, l *api.Lease, reason string) error {
	if err := c.reached(c.alloc.Release(ctx, l.ID)); err != nil {
		return fmt.Errorf("releasing lease %s: %w", l.ID, err)
	}
	c.metrics.releases.WithLabelValues(reason).Inc()
	c.log.Debug("lease released", "lease", l.ID, "namespace", l.Namespace, "pod", l.Owner.Pod, "server", l.Server, "reason", reason)
	return nil
}

// resync repairs what events missed: every pod lease whose pod or node is
// gone, whose pod ended, or whose pod is still unbound long after its
// grant is released; every bound pod without a lease gets one again on
// its node; every namespace's quota is compared with its ResourceQuotas.
func (c *Controller) resync(ctx context.Context, atStart bool) error {
	ls, err := c.alloc.Leases(ctx, client.LeaseFilter{})
	if err := c.reached(err); err != nil {
		return fmt.Errorf("listing leases: %w", err)
	}
	var errs []error
	held := map[types.UID]bool{}
	for i := range ls {
		l := &ls[i]
		if !podLease(l) {
			continue
		}
		held[types.UID(l.Owner.UID)] = true
		reason, err := c.leaseEnd(ctx, l, atStart)
		if err == nil && reason != "" {
			err = c.release(ctx, l, reason)
		}
		errs = append(errs, err)
	}
	for _, obj := range c.pods.GetStore().List() {
		if pod := obj.(*corev1.Pod); !held[pod.UID] && c.needsLease(pod) {
			errs = append(errs, c.restore(ctx, pod))
		}
	}
	return errors.Join(append(errs, c.syncQuotas(ctx))...)
}

// leaseEnd says why a pod lease must end now, or "" while its pod may run
// on an existing node, or may yet be bound there. The cache answers for most leases; a miss is
// confirmed with the API, since the scheduler acquires a lease for a pod,
// on a node, that the cache may not show yet.
func (c *Controller) leaseEnd(ctx context.Context, l *api.Lease, atStart bool) (string, error) {
	pod, err := c.livePod(ctx, l.Namespace, l.Owner.Pod, types.UID(l.Owner.UID))
	switch {
	case err != nil:
		return "", err
	case pod == nil:
		return reasonPodDeleted, nil
	case endReason(pod) != "":
		return endReason(pod), nil
	case pod.Spec.NodeName == "" && time.Since(l.GrantedAt) > c.unboundAfter(atStart):
		// A lease whose scheduling cycle died with kube-scheduler (the
		// plugin's wait for its bind was in its memory), or with this
		// process (the extender's).
		return c.unboundEnd(ctx, l)
	}
	if _, err := c.nodes.Get(l.Server); err == nil {
		return "", nil
	}
	switch _, err := c.client.CoreV1().Nodes().Get(ctx, l.Server, metav1.GetOptions{}); {
	case apierrors.IsNotFound(err):
		return reasonNodeDeleted, nil
	case err != nil:
		return "", fmt.Errorf("node %s: %w", l.Server, err)
	}
	return "", nil
}

// unboundAfter is how long after its grant a lease whose pod is unbound
// ends.
func (c *Controller) unboundAfter(atStart bool) time.Duration {
	if atStart {
		return c.startUnboundTimeout
	}
	return c.unboundTimeout
}

// unboundEnd says why a lease whose pod the cache shows unbound long after
// its grant ends, once kube-apiserver confirms that: the cache may not
// show a bind of an instant ago, whose lease stays. A bind that lands
// between this read and the release, for a pod whose cycle held it that
// long, leaves the pod bound without its lease, which the next resync
// acquires again on its node.
func (c *Controller) unboundEnd(ctx context.Context, l *api.Lease) (string, error) {
	pod, err := c.client.CoreV1().Pods(l.Namespace).Get(ctx, l.Owner.Pod, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) || err == nil && pod.UID != types.UID(l.Owner.UID):
		return reasonPodDeleted, nil
	case err != nil:
		return "", fmt.Errorf("pod %s/%s: %w", l.Namespace, l.Owner.Pod, err)
	case pod.Spec.NodeName != "":
		return "", nil
	}
	return reasonPodUnbound, nil
}

// livePod returns the pod with that UID from the cache, else from the
// API; nil when it no longer exists (a pod created again under its name
// is another pod).
func (c *Controller) livePod(ctx context.Context, namespace, name string, uid types.UID) (*corev1.Pod, error) {
	if objs, err := c.pods.GetIndexer().ByIndex(uidIndex, string(uid)); err == nil && len(objs) > 0 {
		return objs[0].(*corev1.Pod), nil
	}
	pod, err := c.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) || err == nil && pod.UID != uid:
		return nil, nil //nolint:nilnil // no pod is an answer, not a failure
	case err != nil:
		return nil, fmt.Errorf("pod %s/%s: %w", namespace, name, err)
	}
	return pod, nil
}

// needsLease reports whether a pod should hold a lease: the pool placed
// it, it is bound to a node that exists and it has neither ended nor
// begun to terminate. A pod on a deleted node will be deleted with it.
func (c *Controller) needsLease(pod *corev1.Pod) bool {
	if _, placed := pod.Annotations[kube.AnnotationRequest]; !placed || pod.Spec.NodeName == "" ||
		endReason(pod) != "" || pod.DeletionTimestamp != nil {
		return false
	}
	_, err := c.nodes.Get(pod.Spec.NodeName)
	return err == nil
}

// restore acquires again, on the pod's node and with the pod's UID as the
// idempotency key as at bind, the lease of a bound pod whose lease is
// gone (an allocator that lost its store, a lease released by hand), and
// writes it on the pod. When the node cannot hold it any more, the pod
// gets a Warning Event saying why.
func (c *Controller) restore(ctx context.Context, pod *corev1.Pod) error {
	req, err := kube.LeaseRequest(pod, []string{pod.Spec.NodeName})
	if err != nil {
		c.refused(pod, err)
		return nil
	}
	l, err := c.alloc.Acquire(ctx, req)
	switch {
	case unreachable(c.reached(err)):
		return fmt.Errorf("acquiring the lease of pod %s/%s again: %w", pod.Namespace, pod.Name, err)
	case client.IsReason(err, api.ReasonConflict):
		return nil // the key holds a lease acquired since the resync listed them
	case err != nil:
		c.refused(pod, err)
		return nil
	case l.ID == pod.Annotations[kube.AnnotationLease]:
		return nil // acquired since the resync listed the leases: nothing was lost
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":         pod.UID, // the pod, not another under its name
		"annotations": kube.LeaseAnnotations(&l),
	}})
	if err != nil {
		return err
	}
	_, err = c.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsInvalid(err) || apierrors.IsConflict(err):
		return c.release(ctx, &l, reasonPodDeleted) // the pod went meanwhile
	case err != nil:
		return fmt.Errorf("writing lease %s on pod %s/%s: %w", l.ID, pod.Namespace, pod.Name, err)
	}
	c.metrics.reacquisitions.WithLabelValues(outcomeGranted).Inc()
	c.record.Eventf(pod, corev1.EventTypeNormal, eventLeaseRestored, "lease %s acquired again on node %s (the pod's lease was gone)", l.ID, l.Server)
	return nil
}

// refused tells a pod that its lost lease could not be acquired again.
func (c *Controller) refused(pod *corev1.Pod, err error) {
	c.metrics.reacquisitions.WithLabelValues(outcomeRefused).Inc()
	c.record.Eventf(pod, corev1.EventTypeWarning, eventLeaseNotRestored,
		"the pod's lease is gone and cannot be acquired again on node %s: %v", pod.Spec.NodeName, err)
}

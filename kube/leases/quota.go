package leases

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/kube"
)

// requestsGPU is the ResourceQuota resource that bounds a namespace's
// bitfusion.io/gpu (limits. is not valid for an extended resource).
const requestsGPU = corev1.ResourceName(corev1.DefaultResourceRequestsPrefix + kube.ResourceGPU)

// bareGPU is bitfusion.io/gpu as a ResourceQuota's hard, as Bitfusion's
// articles write it (kubectl create quota --hard=bitfusion.io/gpu=32).
// kube-apiserver takes it and enforces nothing: an extended resource is
// quota'd under requests. only. The pool enforces it all the same.
const bareGPU = corev1.ResourceName(kube.ResourceGPU)

// The reasons of the Events written on a ResourceQuota: its hard limit
// refused by the allocator; its limit under bareGPU, enforced by the pool
// alone.
const (
	eventQuotaRefused  = "QuotaNotApplied"
	eventQuotaPoolOnly = "QuotaEnforcedByPoolOnly"
)

// quota is a namespace's GPU quota and the ResourceQuota, and its
// resource, that set it.
type quota struct {
	share    allocator.Share
	from     *corev1.ResourceQuota
	resource corev1.ResourceName
}

// namespaceQuota is a namespace's GPU quota: the least of its
// ResourceQuotas' requests.bitfusion.io/gpu and bitfusion.io/gpu, since a
// pod is admitted only under all of them; nil when none limits it. A
// ResourceQuota that says bitfusion.io/gpu gets an Event saying that the
// pool alone enforces it, and which form kube-apiserver enforces.
func (c *Controller) namespaceQuota(namespace string) (*quota, error) {
	rqs, err := c.quotas.ResourceQuotas(namespace).List(labels.Everything())
	if err != nil {
		return nil, err
	}
	var least *quota
	for _, rq := range rqs {
		for _, name := range []corev1.ResourceName{requestsGPU, bareGPU} {
			hard, ok := rq.Spec.Hard[name]
			if !ok {
				continue
			}
			if name == bareGPU {
				c.record.Eventf(rq, corev1.EventTypeWarning, eventQuotaPoolOnly,
					"%s=%s: kube-apiserver does not enforce it (it enforces %s for an extended resource) and admits pods past it; gpupool enforces it when it places them, as namespace %s's GPU quota",
					bareGPU, hard.String(), requestsGPU, namespace)
			}
			// Pods ask whole units, so a fractional hard admits its whole part.
			q := &quota{share: c.unit.Share(hard.MilliValue()/1000, c.gpuMemory), from: rq, resource: name}
			if least == nil || q.share < least.share {
				least = q
			}
		}
	}
	return least, nil
}

// syncQuota gives the allocator a namespace's quota as its ResourceQuotas
// set it, or removes it when none limits the namespace.
func (c *Controller) syncQuota(ctx context.Context, namespace string) error {
	q, err := c.namespaceQuota(namespace)
	if err != nil {
		return err
	}
	return c.applyQuota(ctx, namespace, q)
}

func (c *Controller) applyQuota(ctx context.Context, namespace string, q *quota) error {
	var err error
	if q == nil {
		err = c.alloc.DeleteQuota(ctx, namespace)
	} else {
		err = c.alloc.SetQuota(ctx, namespace, q.share)
	}
	if client.IsReason(c.reached(err), api.ReasonInvalid) && q != nil {
		// Retrying cannot help; a change of the ResourceQuota queues it again.
		c.record.Eventf(q.from, corev1.EventTypeWarning, eventQuotaRefused, "the allocator refused %s %s as namespace %s's GPU quota: %v",
			q.resource, q.from.Spec.Hard.Name(q.resource, ""), namespace, err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("quota of namespace %s: %w", namespace, err)
	}
	return nil
}

// syncQuotas corrects every namespace quota of the allocator that differs
// from the namespace's ResourceQuotas: after an allocator restart, or a
// ResourceQuota changed or deleted while the controller was down.
func (c *Controller) syncQuotas(ctx context.Context) error {
	have, err := c.alloc.Quotas(ctx)
	if err := c.reached(err); err != nil {
		return fmt.Errorf("listing quotas: %w", err)
	}
	held := map[string]allocator.Share{}
	for _, q := range have {
		if q.Limited {
			held[q.Namespace] = q.Core().Hard
		}
	}
	rqs, err := c.quotas.List(labels.Everything())
	if err != nil {
		return err
	}
	namespaces := map[string]bool{}
	for ns := range held {
		namespaces[ns] = true
	}
	for _, rq := range rqs {
		namespaces[rq.Namespace] = true
	}
	var errs []error
	for ns := range namespaces {
		want, err := c.namespaceQuota(ns)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		current, limited := held[ns]
		if want == nil && !limited || want != nil && limited && want.share == current {
			continue
		}
		errs = append(errs, c.applyQuota(ctx, ns, want))
	}
	return errors.Join(errs...)
}

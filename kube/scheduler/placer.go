// Package scheduler places pods through the pool for kube-scheduler. Its
// core, Placer, takes a pod's lease from the allocator among the nodes
// kube-scheduler found feasible, so that the lease's server is the pod's
// node, and binds the pod there with the lease's ID and GPUs written on
// it for the node side. Two front ends drive it: Plugin, here, the
// scheduler-framework plugin gpupool-kube-scheduler registers (what the
// manifests deploy), and package extender, the HTTP extender
// gpupool-scheduler serves with --listen for an upstream kube-scheduler.
// docs/design.md,
// "Scheduling through the pool", says why the lease is taken while
// filtering.
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/dra"
)

// Config is what a Placer talks to.
type Config struct {
	// Allocator holds an admin token: the placer acquires in every
	// namespace.
	Allocator *client.Client
	// Kube reads pods and binds them.
	Kube kubernetes.Interface
	// Pods, when set, answers most reads of a pod from an informer's
	// cache; the API answers the rest, and the decisions that must not act
	// on a stale pod.
	Pods corelisters.PodLister
	// UnboundLeaseTimeout is how long a lease taken for a pod waits for
	// its bind before it is released, the pod unbound;
	// DefaultUnboundLeaseTimeout when 0.
	UnboundLeaseTimeout time.Duration
	// Registry gets the placer's metrics (MetricFamilies).
	Registry prometheus.Registerer
	// Claims, when set, places the pods that ask for the pool's GPUs in a
	// ResourceClaim (DeviceClass gpu.gpupool.io) too, the lease written as
	// the claim's allocation.
	Claims ClaimStore
}

// PodRef names a pod: the placer reads the pod itself, as kube-apiserver
// has it.
type PodRef struct {
	Namespace, Name string
	UID             types.UID
}

// Placer places pods through the pool: Filter (or Place) takes a pod's
// lease among candidate nodes and answers its server, the one node the pod
// fits; Bind binds the pod to that node with the lease. The calls for one
// pod are taken one at a time, and the lease of a pod that is bound, or
// being bound, is never moved. It logs through the logger of each call's
// context (klog.FromContext).
type Placer struct {
	alloc   *client.Client
	kube    kubernetes.Interface
	pods    livePods
	calls   podCalls
	unbound unboundLeases
	metrics *metrics
	claims  ClaimStore
	catalog catalog
}

// New returns a placer.
func New(cfg Config) *Placer {
	if cfg.UnboundLeaseTimeout <= 0 {
		cfg.UnboundLeaseTimeout = DefaultUnboundLeaseTimeout
	}
	p := &Placer{alloc: cfg.Allocator, kube: cfg.Kube, pods: livePods{cache: cfg.Pods, api: cfg.Kube},
		unbound: unboundLeases{timeout: cfg.UnboundLeaseTimeout}, claims: cfg.Claims}
	p.metrics = newMetrics(cfg.Registry, p.unbound.waiting)
	return p
}

// Filter takes the lease of the pod named, as kube-apiserver has it (never
// as a caller describes it), among nodes, and answers its server: of the
// nodes, the only one the pod fits. A pod the pool cannot place now (no
// capacity, quota, a request it refuses, no request at all) is a
// refusal (Unschedulable), whose text kube-scheduler's FailedScheduling event repeats on
// every node; any other error is the allocator's or kube-apiserver's
// failure to answer. No nodes: nothing is feasible, "" and no error.
func (p *Placer) Filter(ctx context.Context, named PodRef, nodes []string) (string, error) {
	start := time.Now()
	if len(nodes) == 0 {
		// An allocator asked among no servers would place anywhere.
		p.metrics.answered(VerbFilter, resultUnschedulable, start)
		return "", nil
	}
	unlock := p.calls.lock(named.UID, false)
	defer unlock()
	pod, err := p.pods.pod(ctx, named.Namespace, named.Name, named.UID, false)
	if err != nil {
		p.filtered(ctx, named, nodes, api.Lease{}, err, start)
		return "", err
	}
	lease, err := p.place(ctx, pod, nodes)
	p.filtered(ctx, named, nodes, lease, err, start)
	if !Unschedulable(err) {
		// A granted lease ends unless a bind comes; so does one the
		// allocator may have granted with its answer lost.
		p.watchBind(ctx, pod)
	}
	return lease.Server, err
}

// Place takes pod's lease among nodes (nil: any of the pool's servers),
// pod as the caller has it: kube-scheduler's plugin, whose pod is its
// cache's. The errors are Filter's. The lease ends unless Reserve or a
// Bind comes within the wait for a bind.
func (p *Placer) Place(ctx context.Context, pod *v1.Pod, nodes []string) (api.Lease, error) {
	start := time.Now()
	unlock := p.calls.lock(pod.UID, false)
	lease, err := p.place(ctx, pod, nodes)
	unlock()
	p.filtered(ctx, PodRef{pod.Namespace, pod.Name, pod.UID}, nodes, lease, err, start)
	if !Unschedulable(err) {
		p.watchBind(ctx, pod)
	}
	return lease, err
}

// filtered counts and logs a Filter or Place: one record a call at V(2),
// what docs/design.md's "Scheduling at 1,213 nodes" reads the order of the
// pool's decisions from.
func (p *Placer) filtered(ctx context.Context, pod PodRef, nodes []string, lease api.Lease, err error, start time.Time) {
	res := resultPlaced
	log := klog.FromContext(ctx)
	switch {
	case err == nil:
	case Unschedulable(err):
		res = resultUnschedulable
	default:
		res = resultError
		log.Error(err, "filter failed", "pod", pod.Namespace+"/"+pod.Name)
	}
	p.metrics.answered(VerbFilter, res, start)
	log.V(2).Info("filter", "pod", pod.Namespace+"/"+pod.Name, "uid", pod.UID, "nodes", len(nodes), "result", res,
		"server", lease.Server, "lease", lease.ID, "err", errText(err), "took", time.Since(start))
}

// refusal is why the pool will not place a pod now, as its
// FailedScheduling event says it.
type refusal struct{ why string }

func (r *refusal) Error() string { return r.why }

// Unschedulable reports whether err is the pool's refusal to place a pod
// now (no capacity, quota, a request it refuses, no request at all), which
// a front end shows on every node, rather than a failure to answer, which
// is worth a retry.
func Unschedulable(err error) bool { return errors.As(err, new(*refusal)) }

// place acquires pod's lease among nodes; the pool's refusal to is a
// *refusal, any other error the allocator's failure to answer. The caller
// holds the pod's lock.
func (p *Placer) place(ctx context.Context, pod *v1.Pod, nodes []string) (api.Lease, error) {
	req, claim, err := p.leaseRequest(ctx, pod, nodes)
	if err != nil {
		return api.Lease{}, err
	}
	// The filter holds kube-scheduler's one scheduling loop: it does not
	// wait for the store. The bind, beside the loop, does (acquireOn).
	req.AnswerBeforeDurable = true
	lease, err := p.alloc.Acquire(ctx, req)
	if client.IsReason(err, api.ReasonConflict) {
		// The pod's lease from an earlier cycle is on a node no longer
		// among the candidates, or the pod's request changed (its labels).
		// The lease can go and a new one come only while the pod is not
		// bound, nor being bound.
		if err := p.notBound(ctx, pod); err != nil {
			return api.Lease{}, err
		}
		lease, err = p.replace(ctx, pod, req)
	}
	switch {
	case refused(err):
		return lease, &refusal{"gpupool allocator: " + err.Error()}
	case err != nil:
		return lease, fmt.Errorf("gpupool allocator: %w", err)
	case claim != nil:
		if err := p.noteAllocation(claim, lease, pod); err != nil {
			if Unschedulable(err) {
				// Allocated to other GPUs: the lease is no one's.
				_, _ = p.releaseLeases(ctx, pod, "released the lease of a pod whose claim is allocated otherwise")
			}
			return api.Lease{}, err
		}
	}
	return lease, nil
}

// errText is err's message, "" for none.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// notBound returns nil when pod, as kube-apiserver has it now, is not
// bound and no bind of it is under way.
func (p *Placer) notBound(ctx context.Context, pod *v1.Pod) error {
	if p.calls.binding(pod.UID) {
		return fmt.Errorf("gpupool scheduler: a bind of pod %s/%s is under way: its lease stays", pod.Namespace, pod.Name)
	}
	live, err := p.pods.pod(ctx, pod.Namespace, pod.Name, pod.UID, true)
	switch {
	case err != nil:
		return err
	case live.Spec.NodeName != "":
		return fmt.Errorf("gpupool scheduler: pod %s/%s is bound to %s: its lease stays", pod.Namespace, pod.Name, live.Spec.NodeName)
	}
	return nil
}

// replace gives the pod's leases back and acquires again.
func (p *Placer) replace(ctx context.Context, pod *v1.Pod, req api.AcquireRequest) (api.Lease, error) {
	if _, err := p.giveBack(ctx, pod, "filter: released the pod's lease to place it again"); err != nil {
		return api.Lease{}, err
	}
	return p.alloc.Acquire(ctx, req)
}

// Release releases pod's leases, logged with why, unless it is bound or
// being bound: kube-scheduler's cycle failed after the pod's lease was
// taken. A release that fails is left to the wait for a bind.
func (p *Placer) Release(ctx context.Context, pod *v1.Pod, why string) {
	unlock := p.calls.lock(pod.UID, false)
	defer unlock()
	log := klog.FromContext(ctx)
	if err := p.notBound(ctx, pod); err != nil {
		log.V(2).Info("the pod keeps its lease", "pod", pod.Namespace+"/"+pod.Name, "why", err)
		return
	}
	if _, err := p.giveBack(ctx, pod, why); err != nil {
		log.Error(err, "releasing a lease", "pod", pod.Namespace+"/"+pod.Name)
	}
}

// giveBack releases the leases the allocator holds for pod, each logged
// with why, and clears the allocation of its claim, which no pod holds
// yet; it says how many leases it released.
func (p *Placer) giveBack(ctx context.Context, pod *v1.Pod, why string) (int, error) {
	n, err := p.releaseLeases(ctx, pod, why)
	if err != nil {
		return n, err
	}
	return n, p.deallocate(ctx, pod)
}

// releaseLeases releases the leases the allocator holds for pod, each
// logged with why, and says how many it released.
func (p *Placer) releaseLeases(ctx context.Context, pod *v1.Pod, why string) (int, error) {
	held, err := p.alloc.Leases(ctx, client.LeaseFilter{Namespace: pod.Namespace, OwnerUID: string(pod.UID)})
	if err != nil {
		return 0, err
	}
	for i, l := range held {
		if err := p.alloc.Release(ctx, l.ID); err != nil {
			return i, err
		}
		klog.FromContext(ctx).Info(why, "pod", pod.Namespace+"/"+pod.Name, "lease", l.ID, "server", l.Server)
	}
	return len(held), nil
}

// refused reports whether the allocator answered that it will not place
// the request now, as opposed to not answering.
func refused(err error) bool {
	var e *api.Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Reason {
	case api.ReasonNoCapacity, api.ReasonQuotaExceeded, api.ReasonInvalid, api.ReasonConflict:
		return true
	}
	return false
}

// leaseRequest is the pod's lease among servers: the webhook's request
// (kube.LeaseRequest), or its claim's for the pool's GPUs, which the
// lease is then written on; a refusal says why the pool cannot place the
// pod whatever the nodes.
func (p *Placer) leaseRequest(ctx context.Context, pod *v1.Pod, servers []string) (api.AcquireRequest, *podClaim, error) {
	if _, handled := pod.Annotations[kube.AnnotationRequest]; handled {
		req, err := kube.LeaseRequest(pod, servers)
		if err != nil {
			return api.AcquireRequest{}, nil, &refusal{"gpupool: " + err.Error()}
		}
		return req, nil, nil
	}
	claim, err := p.claimOf(ctx, pod)
	switch {
	case err != nil:
		return api.AcquireRequest{}, nil, err
	case claim == nil:
		return api.AcquireRequest{}, nil, &refusal{fmt.Sprintf("gpupool: the pod has no %s annotation: gpupool's admission webhook did not handle it (is it installed, and does the pod ask for %s resources?), and no ResourceClaim of DeviceClass %s", kube.AnnotationRequest, kube.ResourcePrefix, dra.DeviceClassName)}
	}
	return claimRequest(pod, claim, servers), claim, nil
}

// Bind binds the pod to node, the node kube-scheduler chose, with the
// lease its filter took, whose ID and GPUs go on the pod as annotations,
// which kube-apiserver writes in the same write as the node. The Binding
// names the pod's UID, so kube-apiserver refuses it for another pod of the
// name or a pod bound already: no read of the pod comes first. The lease
// comes from acquiring the pod's lease again pinned to the node, which
// answers the filter's lease (the request and its key are the same) once
// it is durable, and takes one on the node when the filter's is gone (its
// wait for the bind expired, the allocator restarted before its write).
func (p *Placer) Bind(ctx context.Context, pod PodRef, node string) error {
	start := time.Now()
	unlock := p.calls.lock(pod.UID, true)
	lease, err := p.bindPod(ctx, pod, node)
	unlock()
	log := klog.FromContext(ctx)
	log.V(2).Info("bind", "pod", pod.Namespace+"/"+pod.Name, "uid", pod.UID, "node", node,
		"lease", lease.ID, "err", errText(err), "took", time.Since(start))
	if err != nil {
		log.Error(err, "bind failed", "pod", pod.Namespace+"/"+pod.Name, "node", node)
		p.metrics.answered(VerbBind, resultError, start)
		return err
	}
	p.unbound.stop(pod.UID)
	p.metrics.answered(VerbBind, resultBound, start)
	return nil
}

func (p *Placer) bindPod(ctx context.Context, ref PodRef, node string) (api.Lease, error) {
	lease, claim, err := p.acquireOn(ctx, ref, node)
	if err != nil {
		return api.Lease{}, err
	}
	annotations := kube.LeaseAnnotations(&lease)
	if claim != nil {
		if err := p.writeAllocation(ctx, claim, lease, ref); err != nil {
			return api.Lease{}, err
		}
		// The pod's request, as the webhook writes it on the pods it
		// handles: what marks a pod the pool placed, whose lease the lease
		// controller ends with it, or acquires again.
		annotations[kube.AnnotationRequest] = claim.Request.Annotation()
	}
	err = p.kube.CoreV1().Pods(ref.Namespace).Bind(ctx, &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: ref.Name, Namespace: ref.Namespace, UID: ref.UID, Annotations: annotations},
		Target:     v1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{})
	if err == nil {
		return lease, nil
	}
	// A bind kube-scheduler gave up waiting for may have landed: this is
	// its retry, and the pod says so.
	pod, perr := p.pods.pod(ctx, ref.Namespace, ref.Name, ref.UID, true)
	switch {
	case perr != nil:
		return api.Lease{}, perr
	case pod.Spec.NodeName == node && pod.Annotations[kube.AnnotationLease] == lease.ID:
		return lease, nil
	case pod.Spec.NodeName != "":
		return api.Lease{}, fmt.Errorf("gpupool scheduler: pod %s/%s is bound to %s already", pod.Namespace, pod.Name, pod.Spec.NodeName)
	}
	return api.Lease{}, fmt.Errorf("gpupool scheduler: binding the pod: %w", err)
}

// acquireOn acquires the pod's lease pinned to the bind's node, and
// answers once it is durable: the filter's grant, answered before its
// write, comes back under the same key; a grant the allocator lost to a
// restart is made again on that node if it still fits. For a pod placed
// by its claim, the claim comes too.
func (p *Placer) acquireOn(ctx context.Context, ref PodRef, node string) (api.Lease, *podClaim, error) {
	pod, err := p.pods.pod(ctx, ref.Namespace, ref.Name, ref.UID, false)
	if err != nil {
		return api.Lease{}, nil, err
	}
	req, claim, err := p.leaseRequest(ctx, pod, []string{node})
	if err != nil {
		return api.Lease{}, nil, err
	}
	lease, err := p.alloc.Acquire(ctx, req)
	if err != nil {
		return api.Lease{}, nil, fmt.Errorf("gpupool allocator: %w", err)
	}
	return lease, claim, nil
}

// Package scheduler is a kube-scheduler extender that places pods through
// the pool: kube-scheduler filters the nodes it can (node selectors,
// taints, CPU, memory), then asks the extender, which acquires the pod's
// lease from the allocator among those nodes and answers the lease's
// server as the only node left. Binding writes the lease and its GPUs on
// the pod for the node side. docs/design.md, "Scheduling through the
// pool", says why an extender and why the lease is taken in filter.
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/kube"
)

// Config is what an Extender talks to.
type Config struct {
	// Allocator holds an admin token: the extender acquires in every
	// namespace.
	Allocator *client.Client
	// Kube reads pods and binds them.
	Kube kubernetes.Interface
	// Pods, when set, answers most reads of a pod from an informer's
	// cache; the API answers the rest, and the decisions that must not act
	// on a stale pod.
	Pods corelisters.PodLister
	// UnboundLeaseTimeout is how long a lease a filter took waits for its
	// pod's bind before it is released, the pod unbound;
	// DefaultUnboundLeaseTimeout when 0.
	UnboundLeaseTimeout time.Duration
	// Registry gets the extender's metrics (MetricFamilies).
	Registry prometheus.Registerer
	Logger   *slog.Logger
}

// Extender answers kube-scheduler's filter and bind calls.
type Extender struct {
	alloc   *client.Client
	kube    kubernetes.Interface
	pods    livePods
	calls   podCalls
	unbound unboundLeases
	log     *slog.Logger
	metrics *metrics
	// names are the node names kube-scheduler sent so far.
	names nameTable
}

// New returns an extender; Handler serves it.
func New(cfg Config) *Extender {
	if cfg.UnboundLeaseTimeout <= 0 {
		cfg.UnboundLeaseTimeout = DefaultUnboundLeaseTimeout
	}
	e := &Extender{alloc: cfg.Allocator, kube: cfg.Kube, pods: livePods{cache: cfg.Pods, api: cfg.Kube}, log: cfg.Logger,
		unbound: unboundLeases{timeout: cfg.UnboundLeaseTimeout}}
	e.metrics = newMetrics(cfg.Registry, e.unbound.waiting)
	return e
}

// filter acquires the pod's lease among the candidate nodes and answers
// its server as the only feasible node. A pod the pool cannot place now
// (no capacity, quota, a request it refuses, no request at all) fails on
// every candidate with the reason, which kube-scheduler's FailedScheduling
// event repeats; an allocator that cannot answer is an Error, which the
// event repeats too.
func (e *Extender) filter(ctx context.Context, args *filterArgs) (*extenderv1.ExtenderFilterResult, result) {
	switch {
	case args.Pod == nil:
		return &extenderv1.ExtenderFilterResult{Error: "gpupool extender: the filter call names no pod"}, resultError
	case !args.NodeNames.given:
		// Whole nodes for every pod would be megabytes per call at a
		// thousand nodes; the names are all the allocator needs.
		return &extenderv1.ExtenderFilterResult{Error: "gpupool extender: kube-scheduler sent nodes, not node names: set nodeCacheCapable: true in its extender configuration"}, resultError
	}
	start := time.Now()
	named, nodes := args.Pod, args.NodeNames.names
	if len(nodes) == 0 {
		// Nothing is feasible: an allocator asked among no servers would
		// place anywhere.
		return &extenderv1.ExtenderFilterResult{NodeNames: &[]string{}}, resultUnschedulable
	}
	unlock := e.calls.lock(named.UID, false)
	defer unlock()
	var lease api.Lease
	pod, err := e.pods.pod(ctx, named.Namespace, named.Name, named.UID, false)
	if err == nil {
		lease, err = e.place(ctx, pod, nodes)
	}
	var answer *extenderv1.ExtenderFilterResult
	res := resultPlaced
	switch {
	case err == nil:
		answer = &extenderv1.ExtenderFilterResult{NodeNames: &[]string{lease.Server}}
		e.watchBind(pod)
	case errors.As(err, new(*refusal)):
		answer, res = unschedulable(nodes, err.Error()), resultUnschedulable
	default:
		e.log.Warn("filter failed", "pod", named.Namespace+"/"+named.Name, "err", err)
		answer, res = &extenderv1.ExtenderFilterResult{Error: err.Error()}, resultError
		if pod != nil {
			// The allocator may have granted a lease whose answer was
			// lost: it too ends unless a bind comes.
			e.watchBind(pod)
		}
	}
	// One record a call: what docs/design.md's "Scheduling at
	// 1,213 nodes" reads the order of the pool's decisions from.
	e.log.Debug("filter", "pod", named.Namespace+"/"+named.Name, "uid", named.UID, "nodes", len(nodes), "result", res,
		"server", lease.Server, "lease", lease.ID, "err", errText(err), "took", time.Since(start))
	return answer, res
}

// refusal is why the pool will not place a pod now, as its
// FailedScheduling event says it.
type refusal struct{ why string }

func (r *refusal) Error() string { return r.why }

// place acquires pod's lease among nodes; the pool's refusal to is a
// *refusal, any other error the allocator's failure to answer.
func (e *Extender) place(ctx context.Context, pod *v1.Pod, nodes []string) (api.Lease, error) {
	req, err := leaseRequest(pod, nodes)
	if err != nil {
		return api.Lease{}, &refusal{err.Error()}
	}
	// The filter holds kube-scheduler's one scheduling loop: it does not
	// wait for the store. The bind, beside the loop, does (acquireOn).
	req.AnswerBeforeDurable = true
	lease, err := e.alloc.Acquire(ctx, req)
	if client.IsReason(err, api.ReasonConflict) {
		// The pod's lease from an earlier cycle is on a node no longer
		// among the candidates, or the pod's request changed (its labels).
		// The lease can go and a new one come only while the pod is not
		// bound, nor being bound.
		if err := e.notBound(ctx, pod); err != nil {
			return api.Lease{}, err
		}
		lease, err = e.replace(ctx, pod, req)
	}
	switch {
	case refused(err):
		return lease, &refusal{"gpupool allocator: " + err.Error()}
	case err != nil:
		return lease, fmt.Errorf("gpupool allocator: %w", err)
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
func (e *Extender) notBound(ctx context.Context, pod *v1.Pod) error {
	if e.calls.binding(pod.UID) {
		return fmt.Errorf("gpupool extender: a bind of pod %s/%s is under way: its lease stays", pod.Namespace, pod.Name)
	}
	live, err := e.pods.pod(ctx, pod.Namespace, pod.Name, pod.UID, true)
	switch {
	case err != nil:
		return err
	case live.Spec.NodeName != "":
		return fmt.Errorf("gpupool extender: pod %s/%s is bound to %s: its lease stays", pod.Namespace, pod.Name, live.Spec.NodeName)
	}
	return nil
}

// replace releases the pod's leases and acquires again.
func (e *Extender) replace(ctx context.Context, pod *v1.Pod, req api.AcquireRequest) (api.Lease, error) {
	if _, err := e.releaseLeases(ctx, pod, "filter: released the pod's lease to place it again"); err != nil {
		return api.Lease{}, err
	}
	return e.alloc.Acquire(ctx, req)
}

// releaseLeases releases the leases the allocator holds for pod, each
// logged with why, and says how many it released.
func (e *Extender) releaseLeases(ctx context.Context, pod *v1.Pod, why string) (int, error) {
	held, err := e.alloc.Leases(ctx, client.LeaseFilter{Namespace: pod.Namespace, OwnerUID: string(pod.UID)})
	if err != nil {
		return 0, err
	}
	for i, l := range held {
		if err := e.alloc.Release(ctx, l.ID); err != nil {
			return i, err
		}
		e.log.Info(why, "pod", pod.Namespace+"/"+pod.Name, "lease", l.ID, "server", l.Server)
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

// unschedulable fails every node with why. Unresolvable: kube-scheduler's
// preemption only frees what its own filters count, never a GPU share, so
// evicting pods for this one would be for nothing.
func unschedulable(nodes []string, why string) *extenderv1.ExtenderFilterResult {
	failed := make(extenderv1.FailedNodesMap, len(nodes))
	for _, n := range nodes {
		failed[n] = why
	}
	return &extenderv1.ExtenderFilterResult{FailedAndUnresolvableNodes: failed}
}

// leaseRequest is the pod's lease among servers (kube.LeaseRequest), or
// why the pool cannot place the pod whatever the nodes.
func leaseRequest(pod *v1.Pod, servers []string) (api.AcquireRequest, error) {
	if _, handled := pod.Annotations[kube.AnnotationRequest]; !handled {
		return api.AcquireRequest{}, fmt.Errorf("gpupool: the pod has no %s annotation: gpupool's admission webhook did not handle it (is it installed, and does the pod ask for %s resources?)", kube.AnnotationRequest, kube.ResourcePrefix)
	}
	req, err := kube.LeaseRequest(pod, servers)
	if err != nil {
		return api.AcquireRequest{}, fmt.Errorf("gpupool: %w", err)
	}
	return req, nil
}

// bind binds the pod to the node kube-scheduler chose with the lease
// its filter took, whose ID and GPUs go on the pod as annotations, which
// kube-apiserver writes in the same write as the node. The Binding names
// the pod's UID, so kube-apiserver refuses it for another pod of the name
// or a pod bound already: no read of the pod comes first. The lease comes
// from acquiring the pod's lease again pinned to the node, which answers
// the filter's lease (the request and its key are the same) once it is
// durable, and takes one on the node when the filter's is gone (its wait
// for the bind expired, the allocator restarted before its write).
func (e *Extender) bind(ctx context.Context, args *extenderv1.ExtenderBindingArgs) (*extenderv1.ExtenderBindingResult, result) {
	start := time.Now()
	unlock := e.calls.lock(args.PodUID, true)
	lease, err := e.bindPod(ctx, args)
	unlock()
	e.log.Debug("bind", "pod", args.PodNamespace+"/"+args.PodName, "uid", args.PodUID, "node", args.Node,
		"lease", lease.ID, "err", errText(err), "took", time.Since(start))
	if err != nil {
		e.log.Warn("bind failed", "pod", args.PodNamespace+"/"+args.PodName, "node", args.Node, "err", err)
		return &extenderv1.ExtenderBindingResult{Error: err.Error()}, resultError
	}
	e.unbound.stop(args.PodUID)
	return &extenderv1.ExtenderBindingResult{}, resultBound
}

func (e *Extender) bindPod(ctx context.Context, args *extenderv1.ExtenderBindingArgs) (api.Lease, error) {
	lease, err := e.acquireOn(ctx, args)
	if err != nil {
		return api.Lease{}, err
	}
	err = e.kube.CoreV1().Pods(args.PodNamespace).Bind(ctx, &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: args.PodName, Namespace: args.PodNamespace, UID: args.PodUID, Annotations: kube.LeaseAnnotations(&lease)},
		Target:     v1.ObjectReference{Kind: "Node", Name: args.Node},
	}, metav1.CreateOptions{})
	if err == nil {
		return lease, nil
	}
	// A bind kube-scheduler gave up waiting for may have landed: this is
	// its retry, and the pod says so.
	pod, perr := e.pods.pod(ctx, args.PodNamespace, args.PodName, args.PodUID, true)
	switch {
	case perr != nil:
		return api.Lease{}, perr
	case pod.Spec.NodeName == args.Node && pod.Annotations[kube.AnnotationLease] == lease.ID:
		return lease, nil
	case pod.Spec.NodeName != "":
		return api.Lease{}, fmt.Errorf("gpupool extender: pod %s/%s is bound to %s already", pod.Namespace, pod.Name, pod.Spec.NodeName)
	}
	return api.Lease{}, fmt.Errorf("gpupool extender: binding the pod: %w", err)
}

// acquireOn acquires the pod's lease pinned to the bind's node, and
// answers once it is durable: the filter's grant, answered before its
// write, comes back under the same key; a grant the allocator lost to a
// restart is made again on that node if it still fits.
func (e *Extender) acquireOn(ctx context.Context, args *extenderv1.ExtenderBindingArgs) (api.Lease, error) {
	pod, err := e.pods.pod(ctx, args.PodNamespace, args.PodName, args.PodUID, false)
	if err != nil {
		return api.Lease{}, err
	}
	req, err := leaseRequest(pod, []string{args.Node})
	if err != nil {
		return api.Lease{}, err
	}
	lease, err := e.alloc.Acquire(ctx, req)
	if err != nil {
		return api.Lease{}, fmt.Errorf("gpupool allocator: %w", err)
	}
	return lease, nil
}

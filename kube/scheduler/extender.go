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

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
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
	// Registry gets the extender's metrics (MetricFamilies).
	Registry prometheus.Registerer
	Logger   *slog.Logger
}

// Extender answers kube-scheduler's filter and bind calls.
type Extender struct {
	alloc   *client.Client
	kube    kubernetes.Interface
	log     *slog.Logger
	metrics *metrics
	// names are the node names kube-scheduler sent so far.
	names nameTable
}

// New returns an extender; Handler serves it.
func New(cfg Config) *Extender {
	return &Extender{alloc: cfg.Allocator, kube: cfg.Kube, log: cfg.Logger, metrics: newMetrics(cfg.Registry)}
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
	pod, nodes := args.Pod, args.NodeNames.names
	req, err := leaseRequest(pod, nodes)
	if err != nil {
		return unschedulable(nodes, err.Error()), resultUnschedulable
	}
	lease, err := e.alloc.Acquire(ctx, req)
	if client.IsReason(err, api.ReasonConflict) {
		// The pod's lease from an earlier cycle is on a node no longer
		// among the candidates, or the pod's request changed (its labels):
		// the pod is not bound, so the lease can go and a new one come.
		lease, err = e.replace(ctx, pod, req)
	}
	switch {
	case err == nil:
		return &extenderv1.ExtenderFilterResult{NodeNames: &[]string{lease.Server}}, resultPlaced
	case refused(err):
		return unschedulable(nodes, "gpupool allocator: "+err.Error()), resultUnschedulable
	default:
		e.log.Warn("filter: the allocator did not answer", "pod", pod.Namespace+"/"+pod.Name, "err", err)
		return &extenderv1.ExtenderFilterResult{Error: "gpupool allocator: " + err.Error()}, resultError
	}
}

// replace releases the pod's leases and acquires again.
func (e *Extender) replace(ctx context.Context, pod *v1.Pod, req api.AcquireRequest) (api.Lease, error) {
	held, err := e.alloc.Leases(ctx, client.LeaseFilter{Namespace: pod.Namespace, OwnerUID: string(pod.UID)})
	if err != nil {
		return api.Lease{}, err
	}
	for _, l := range held {
		if err := e.alloc.Release(ctx, l.ID); err != nil {
			return api.Lease{}, err
		}
		e.log.Info("filter: released the pod's lease to place it again", "pod", pod.Namespace+"/"+pod.Name, "lease", l.ID, "server", l.Server)
	}
	return e.alloc.Acquire(ctx, req)
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

// bind acquires the pod's lease again, pinned to the node kube-scheduler
// chose (the same lease filter acquired: the request and its key are the
// same), and binds the pod with the lease and its GPUs as annotations,
// which kube-apiserver copies onto the pod in the same write as the node.
func (e *Extender) bind(ctx context.Context, args *extenderv1.ExtenderBindingArgs) (*extenderv1.ExtenderBindingResult, result) {
	err := e.bindPod(ctx, args)
	if err != nil {
		e.log.Warn("bind failed", "pod", args.PodNamespace+"/"+args.PodName, "node", args.Node, "err", err)
		return &extenderv1.ExtenderBindingResult{Error: err.Error()}, resultError
	}
	return &extenderv1.ExtenderBindingResult{}, resultBound
}

func (e *Extender) bindPod(ctx context.Context, args *extenderv1.ExtenderBindingArgs) error {
	pods := e.kube.CoreV1().Pods(args.PodNamespace)
	pod, err := pods.Get(ctx, args.PodName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("gpupool extender: reading the pod: %w", err)
	}
	if pod.UID != args.PodUID {
		return fmt.Errorf("gpupool extender: pod %s/%s is now UID %s, kube-scheduler binds UID %s", pod.Namespace, pod.Name, pod.UID, args.PodUID)
	}
	req, err := leaseRequest(pod, []string{args.Node})
	if err != nil {
		return err
	}
	lease, err := e.alloc.Acquire(ctx, req)
	if err != nil {
		return fmt.Errorf("gpupool allocator: %w", err)
	}
	err = pods.Bind(ctx, &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, Annotations: kube.LeaseAnnotations(&lease)},
		Target:     v1.ObjectReference{Kind: "Node", Name: args.Node},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("gpupool extender: binding the pod: %w", err)
	}
	return nil
}

package scheduler

import (
	"context"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// DefaultUnboundLeaseTimeout is how long a lease taken in filter waits
// for its pod's bind by default: kube-scheduler binds within its extender
// httpTimeout (5 s) of the filter, or reserves the node in the plugin's
// cycle, unless the cycle failed.
const DefaultUnboundLeaseTimeout = 30 * time.Second

// unboundLeases ends the leases that filters took for pods that were not
// bound within the timeout. The extender protocol has no Unreserve: when
// kube-scheduler's cycle fails after the filter (a bind it gave up on, a
// filter answer it stopped waiting for, a pod it found unschedulable on
// its retry) nothing tells the placer, and the lease would hold GPUs for
// a pod that may never run. The plugin's cycle stops the wait at Reserve;
// a cycle that fails before Reserve leaves its lease to the wait.
type unboundLeases struct {
	timeout time.Duration
	mu      sync.Mutex
	// waits are the pods whose filter took a lease, each with the timer
	// of its wait for the bind.
	waits map[types.UID]*time.Timer
}

// watch (re)starts the pod's wait for its bind; expire runs at the end.
func (u *unboundLeases) watch(uid types.UID, expire func()) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if w := u.waits[uid]; w != nil {
		w.Stop()
	}
	if u.waits == nil {
		u.waits = map[types.UID]*time.Timer{}
	}
	// The callback takes u.mu, held here until w is in the map.
	var w *time.Timer
	w = time.AfterFunc(u.timeout, func() {
		u.mu.Lock()
		current := u.waits[uid] == w
		if current {
			delete(u.waits, uid)
		}
		u.mu.Unlock()
		if current {
			expire()
		}
	})
	u.waits[uid] = w
}

// stop ends the pod's wait: it is bound, or reserved (the plugin), after
// which Unreserve or Bind ends its lease.
func (u *unboundLeases) stop(uid types.UID) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if w := u.waits[uid]; w != nil {
		w.Stop()
		delete(u.waits, uid)
	}
}

// waiting is how many pods hold a lease from a filter and wait for a bind.
func (u *unboundLeases) waiting() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.waits)
}

// Reserve stops the pod's wait for its bind: kube-scheduler reserved its
// node, after which Unreserve or Bind ends its lease, however long Permit
// and PreBind hold the pod.
func (p *Placer) Reserve(uid types.UID) { p.unbound.stop(uid) }

// Unreserve releases the pod's lease, unless it is bound or being bound:
// kube-scheduler's cycle failed after Reserve. The wait for a bind starts
// again first: should this release fail, the wait's end releases the
// lease.
func (p *Placer) Unreserve(ctx context.Context, pod *v1.Pod, why string) {
	p.watchBind(ctx, pod)
	p.Release(ctx, pod, why)
}

// watchBind releases pod's leases if it is not bound within the timeout,
// logging through ctx's logger.
func (p *Placer) watchBind(ctx context.Context, pod *v1.Pod) {
	log := klog.FromContext(ctx)
	p.unbound.watch(pod.UID, func() {
		ctx, cancel := context.WithTimeout(klog.NewContext(context.Background(), log), 30*time.Second)
		defer cancel()
		unlock := p.calls.lock(pod.UID, false)
		defer unlock()
		if err := p.notBound(ctx, pod); err != nil {
			log.V(4).Info("a pod past its wait for a bind keeps its lease", "pod", pod.Namespace+"/"+pod.Name, "why", err)
			return
		}
		n, err := p.giveBack(ctx, pod, "released the lease of a pod not bound in time after its filter: its scheduling cycle failed")
		p.metrics.unboundReleased.Add(float64(n))
		if err != nil {
			log.Error(err, "releasing the leases of a pod not bound in time", "pod", pod.Namespace+"/"+pod.Name)
		}
	})
}

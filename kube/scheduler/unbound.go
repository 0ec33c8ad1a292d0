package scheduler

import (
	"context"
	"errors"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
)

// DefaultUnboundLeaseTimeout is how long a lease taken in filter waits
// for its pod's bind by default: kube-scheduler binds within its extender
// httpTimeout (5 s) of the filter unless the cycle failed.
const DefaultUnboundLeaseTimeout = 30 * time.Second

// unboundLeases ends the leases that filters took for pods that were not
// bound within the timeout. The extender protocol has no Unreserve: when
// kube-scheduler's cycle fails after the filter (a bind it gave up on, a
// filter answer it stopped waiting for, a pod it found unschedulable on
// its retry) nothing tells the extender, and the lease would hold GPUs for
// a pod that may never run.
type unboundLeases struct {
	timeout time.Duration
	mu      sync.Mutex
	waits   map[types.UID]*bindWait
}

// bindWait is a pod's lease from its filter, waiting for the bind.
type bindWait struct {
	lease api.Lease
	timer *time.Timer
}

// watch (re)starts the pod's wait for its bind with the lease its filter
// took; expire runs at the end.
func (u *unboundLeases) watch(uid types.UID, lease api.Lease, expire func()) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if w := u.waits[uid]; w != nil {
		w.timer.Stop()
	}
	if u.waits == nil {
		u.waits = map[types.UID]*bindWait{}
	}
	w := &bindWait{lease: lease}
	w.timer = time.AfterFunc(u.timeout, func() {
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

// lease is the lease the pod's filter took, if it waits for its bind.
func (u *unboundLeases) lease(uid types.UID) (api.Lease, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if w := u.waits[uid]; w != nil {
		return w.lease, true
	}
	return api.Lease{}, false
}

// bound ends the pod's wait.
func (u *unboundLeases) bound(uid types.UID) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if w := u.waits[uid]; w != nil {
		w.timer.Stop()
		delete(u.waits, uid)
	}
}

// waiting is how many pods hold a lease from a filter and wait for a bind.
func (u *unboundLeases) waiting() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.waits)
}

// watchBind releases pod's leases if it is not bound within the timeout.
func (e *Extender) watchBind(pod *v1.Pod, lease api.Lease) {
	namespace, name, uid := pod.Namespace, pod.Name, pod.UID
	e.unbound.watch(uid, lease, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		unlock := e.calls.lock(uid, false)
		defer unlock()
		if e.calls.binding(uid) {
			return
		}
		live, err := e.pods.pod(ctx, namespace, name, uid, true)
		switch {
		case errors.As(err, new(*errNoSuchPod)):
			return // the lease controller ends a deleted pod's lease
		case err != nil:
			e.log.Warn("could not check a pod that waits for its bind; its lease stays until the lease controller's resync", "pod", namespace+"/"+name, "err", err)
			return
		case live.Spec.NodeName != "":
			return
		}
		held, err := e.alloc.Leases(ctx, client.LeaseFilter{Namespace: namespace, OwnerUID: string(uid)})
		if err != nil {
			e.log.Warn("listing the leases of a pod not bound in time", "pod", namespace+"/"+name, "err", err)
			return
		}
		for _, l := range held {
			if err := e.alloc.Release(ctx, l.ID); err != nil {
				e.log.Warn("releasing the lease of a pod not bound in time", "pod", namespace+"/"+name, "lease", l.ID, "err", err)
				continue
			}
			e.metrics.unboundReleased.Inc()
			e.log.Info("released the lease of a pod not bound in time after its filter: its scheduling cycle failed",
				"pod", namespace+"/"+name, "lease", l.ID, "server", l.Server, "timeout", e.unbound.timeout)
		}
	})
}

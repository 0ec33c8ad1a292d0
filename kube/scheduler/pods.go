package scheduler

import (
	"context"
	"fmt"
	"sync"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
)

// livePods reads pods as kube-apiserver has them. The placer acts on
// those, never on the pod a caller describes: whoever reaches the
// extender's /filter could otherwise describe a bound pod as unbound, or a
// pod that does not exist.
type livePods struct {
	// cache answers most reads; nil reads the API every time.
	cache corelisters.PodLister
	api   kubernetes.Interface
}

// errNoSuchPod is a pod the call names that kube-apiserver does not have
// under that UID.
type errNoSuchPod struct {
	namespace, name string
	uid             types.UID
}

func (e *errNoSuchPod) Error() string {
	return fmt.Sprintf("gpupool scheduler: no pod %s/%s with UID %s in the cluster", e.namespace, e.name, e.uid)
}

// pod is the pod with that UID. The cache may not show a pod created an
// instant ago yet, nor one bound an instant ago: fresh asks the API, for
// the decisions that must not act on a stale pod.
func (p *livePods) pod(ctx context.Context, namespace, name string, uid types.UID, fresh bool) (*v1.Pod, error) {
	if p.cache != nil && !fresh {
		if pod, err := p.cache.Pods(namespace).Get(name); err == nil && pod.UID == uid {
			return pod, nil
		}
	}
	pod, err := p.api.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) || err == nil && pod.UID != uid:
		return nil, &errNoSuchPod{namespace, name, uid}
	case err != nil:
		return nil, fmt.Errorf("gpupool scheduler: reading pod %s/%s: %w", namespace, name, err)
	}
	return pod, nil
}

// podCalls serializes the calls for one pod, and knows which pods have a
// bind under way: a filter for a pod kube-scheduler gave up binding (its
// httpTimeout) may come while that bind still lands, and must not move the
// lease the bind is writing on the pod.
type podCalls struct {
	mu    sync.Mutex
	calls map[types.UID]*podCall
}

type podCall struct {
	sync.Mutex
	waiting int // calls holding or waiting for the lock
	binding int // binds among them
}

// lock waits for the pod's calls before it to end, and returns what ends
// this one. A bind says so, for binding.
func (c *podCalls) lock(uid types.UID, bind bool) (unlock func()) {
	c.mu.Lock()
	if c.calls == nil {
		c.calls = map[types.UID]*podCall{}
	}
	pc := c.calls[uid]
	if pc == nil {
		pc = &podCall{}
		c.calls[uid] = pc
	}
	pc.waiting++
	if bind {
		pc.binding++
	}
	c.mu.Unlock()
	pc.Lock()
	return func() {
		pc.Unlock()
		c.mu.Lock()
		defer c.mu.Unlock()
		pc.waiting--
		if bind {
			pc.binding--
		}
		if pc.waiting == 0 {
			delete(c.calls, uid) // the map holds only pods with calls under way
		}
	}
}

// binding reports whether a bind of the pod is under way or waiting.
func (c *podCalls) binding(uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	pc := c.calls[uid]
	return pc != nil && pc.binding > 0
}

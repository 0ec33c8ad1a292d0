package deviceplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/gpupool/gpupool/kube"
)

// pods is the plugin's view of the pods bound to its node: an informer
// on them, the order their bindings arrived in, and the pods this process
// marked allocated, which the informer may not show so yet.
type pods struct {
	node     string
	client   kubernetes.Interface
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer

	mu       sync.Mutex
	arrivals map[types.UID]uint64
	last     uint64
	// allocated is the pods this process marked, with the devices' digest.
	allocated map[types.UID]allocation
}

// allocation is a pod marked allocated and the digest of its devices.
type allocation struct {
	pod    string // namespace/name
	digest string
}

func newPods(client kubernetes.Interface, node string) (*pods, error) {
	onNode := fields.OneTermEqualSelector("spec.nodeName", node).String()
	p := &pods{
		node: node, client: client, arrivals: map[types.UID]uint64{}, allocated: map[types.UID]allocation{},
		factory: informers.NewSharedInformerFactoryWithOptions(client, 0,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = onNode })),
	}
	p.informer = p.factory.Core().V1().Pods().Informer()
	// A pod's managed fields are most of its size and never read here.
	if err := p.informer.SetTransform(func(obj any) (any, error) {
		if pod, ok := obj.(*corev1.Pod); ok {
			pod.ManagedFields = nil
		}
		return obj, nil
	}); err != nil {
		return nil, err
	}
	_, err := p.informer.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc:    func(obj any, initial bool) { p.seen(obj.(*corev1.Pod), initial) },
		UpdateFunc: func(_, obj any) { p.seen(obj.(*corev1.Pod), false) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				p.forget(pod.UID)
			}
		},
	})
	return p, err
}

// run starts the informer and waits until it has listed the node's pods,
// or ctx ends (false).
func (p *pods) run(ctx context.Context) bool {
	p.factory.Start(ctx.Done())
	return cache.WaitForCacheSync(ctx.Done(), p.informer.HasSynced)
}

// seen records when a pod was first seen bound to the node: in the
// informer's first list (0: the order of those is the kubelet's creation
// order) or after, as its binding arrived.
func (p *pods) seen(pod *corev1.Pod, initial bool) {
	if pod.Spec.NodeName != p.node {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, known := p.arrivals[pod.UID]; known {
		return
	}
	if !initial {
		p.last++
		p.arrivals[pod.UID] = p.last
	} else {
		p.arrivals[pod.UID] = 0
	}
}

func (p *pods) forget(uid types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.arrivals, uid)
	delete(p.allocated, uid)
}

// kubeletStarted says the kubelet started again: it admits the pods bound
// before in creation order, as one list, whatever order they came in.
func (p *pods) kubeletStarted() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for uid := range p.arrivals {
		p.arrivals[uid] = 0
	}
}

// errNoPod is Allocate's error when no waiting pod asks for the devices.
var errNoPod = errors.New("no pod")

// next is the pod the kubelet allocates size devices for. The kubelet may
// act on a binding before the informer delivers it: with no such pod in
// the informer's cache, the API is asked.
func (p *pods) next(ctx context.Context, size int) (*corev1.Pod, error) {
	if pod, ok := next(p.waiting(p.informer.GetStore().List()), size); ok {
		return pod, nil
	}
	list, err := p.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", p.node).String()})
	if err != nil {
		return nil, fmt.Errorf("listing the pods of node %s: %w", p.node, err)
	}
	live := make([]any, len(list.Items))
	for i := range list.Items {
		p.seen(&list.Items[i], false)
		live[i] = &list.Items[i]
	}
	if pod, ok := next(p.waiting(live), size); ok {
		return pod, nil
	}
	return nil, errNoPod
}

// waiting are the pods of objs that await their devices, with their
// arrivals.
func (p *pods) waiting(objs []any) []waiting {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []waiting
	for _, obj := range objs {
		pod := obj.(*corev1.Pod)
		if _, marked := p.allocated[pod.UID]; awaitsDevices(pod, p.node) && !marked {
			out = append(out, waiting{pod: pod, arrival: p.arrivals[pod.UID]})
		}
	}
	return out
}

// markAllocated writes AnnotationAllocated on pod, so that no later
// Allocate, of this process or the next, hands its lease again.
func (p *pods) markAllocated(ctx context.Context, pod *corev1.Pod, digest string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"annotations": map[string]string{kube.AnnotationAllocated: digest},
		// The patch applies to this pod only, not to one made again
		// under its name.
		"uid": pod.UID,
	}})
	if err != nil {
		return err
	}
	if _, err := p.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("marking pod %s/%s allocated: %w", pod.Namespace, pod.Name, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.allocated[pod.UID] = allocation{pod: pod.Namespace + "/" + pod.Name, digest: digest}
	return nil
}

// allocatedWith is the pod (namespace/name) of the node's that was marked
// allocated devices digest: by this process, or as far as the informer
// knows (a plugin before it), since its watch may not yet show this
// process's own marks.
func (p *pods) allocatedWith(digest string) (string, bool) {
	p.mu.Lock()
	for _, a := range p.allocated {
		if a.digest == digest {
			p.mu.Unlock()
			return a.pod, true
		}
	}
	p.mu.Unlock()
	objs := p.informer.GetStore().List()
	i := slices.IndexFunc(objs, func(obj any) bool { return obj.(*corev1.Pod).Annotations[kube.AnnotationAllocated] == digest })
	if i < 0 {
		return "", false
	}
	pod := objs[i].(*corev1.Pod)
	return pod.Namespace + "/" + pod.Name, true
}

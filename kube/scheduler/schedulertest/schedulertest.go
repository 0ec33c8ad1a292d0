// Package schedulertest holds what the tests of the placer and of its
// front ends share: a cluster that binds pods as kube-apiserver does, and
// pods the webhook handled.
package schedulertest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/kube"
)

// Half is half of one GPU.
var Half = kube.Request{GPUAmount: 1, GPUPercent: 50}

// Pod is a pod the webhook handled, in namespace team-a: it asks for r,
// its one container for 500m CPU and 1Gi of memory.
func Pod(name string, r kube.Request) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team-a", UID: types.UID("uid-" + name),
			Labels: map[string]string{"app": "trainer"}, Annotations: map[string]string{kube.AnnotationRequest: r.Annotation()}},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "main", Resources: Requests("500m", "1Gi")}}},
	}
}

// Requests are a container's CPU and memory requests.
func Requests(cpu, memory string) v1.ResourceRequirements {
	return v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu), v1.ResourceMemory: resource.MustParse(memory)}}
}

// Cluster is a fake clientset that binds pods as kube-apiserver does,
// which the fake alone does not: a Binding sets the pod's node and adds
// the Binding's annotations, and is refused for a pod bound already or
// of another UID.
type Cluster struct {
	*fake.Clientset

	mu    sync.Mutex
	taken []*v1.Binding
}

// NewCluster returns a cluster holding objs.
func NewCluster(objs ...runtime.Object) *Cluster {
	c := &Cluster{Clientset: fake.NewClientset(objs...)}
	c.PrependReactor("create", "pods", c.bind)
	return c
}

func (c *Cluster) bind(a k8stesting.Action) (bool, runtime.Object, error) {
	if a.GetSubresource() != "binding" {
		return false, nil, nil
	}
	b := a.(k8stesting.CreateAction).GetObject().(*v1.Binding)
	tracker := c.Tracker()
	obj, err := tracker.Get(v1.SchemeGroupVersion.WithResource("pods"), b.Namespace, b.Name)
	if err != nil {
		return true, nil, err
	}
	pod := obj.(*v1.Pod).DeepCopy()
	if b.UID != "" && b.UID != pod.UID {
		return true, nil, apierrors.NewConflict(v1.Resource("pods/binding"), pod.Name, fmt.Errorf("precondition failed: UID in precondition: %s, UID in object meta: %s", b.UID, pod.UID))
	}
	if pod.Spec.NodeName != "" {
		return true, nil, apierrors.NewConflict(v1.Resource("pods/binding"), pod.Name, fmt.Errorf("pod %s is already assigned to node %q", pod.Name, pod.Spec.NodeName))
	}
	pod.Spec.NodeName = b.Target.Name
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	maps.Copy(pod.Annotations, b.Annotations)
	if err := tracker.Update(v1.SchemeGroupVersion.WithResource("pods"), pod, pod.Namespace); err != nil {
		return true, nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.taken = append(c.taken, b)
	return true, b, nil
}

// Bindings are the Bindings the cluster took so far.
func (c *Cluster) Bindings() []*v1.Binding {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.taken)
}

// Put makes pod the cluster's copy, creating or replacing it.
func (c *Cluster) Put(t testing.TB, pod *v1.Pod) {
	t.Helper()
	pods := c.CoreV1().Pods(pod.Namespace)
	_, err := pods.Update(context.Background(), pod, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		_, err = pods.Create(context.Background(), pod, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
}

// Leases are the allocator's leases of pod.
func Leases(t testing.TB, alloc *client.Client, pod *v1.Pod) []api.Lease {
	t.Helper()
	ls, err := alloc.Leases(context.Background(), client.LeaseFilter{Namespace: pod.Namespace, OwnerUID: string(pod.UID)})
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

// Claims is kube-scheduler's store of ResourceClaims as the placer uses
// it, over the cluster: what the API has, unless a claim was noted since
// (assumed), until that note is restored.
type Claims struct {
	Cluster *Cluster

	mu      sync.Mutex
	noted   map[string]*resourceapi.ResourceClaim
	assumed int
}

// Get reads the claim noted, else the cluster's, which has every write at
// once.
func (c *Claims) Get(namespace, name string) (*resourceapi.ResourceClaim, error) {
	c.mu.Lock()
	noted, ok := c.noted[namespace+"/"+name]
	c.mu.Unlock()
	if ok {
		return noted.DeepCopy(), nil
	}
	return c.Cluster.ResourceV1().ResourceClaims(namespace).Get(context.Background(), name, metav1.GetOptions{})
}

// AssumeClaimAfterAPICall notes the claim, and counts it.
func (c *Claims) AssumeClaimAfterAPICall(claim *resourceapi.ResourceClaim) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.noted == nil {
		c.noted = map[string]*resourceapi.ResourceClaim{}
	}
	c.noted[claim.Namespace+"/"+claim.Name] = claim.DeepCopy()
	c.assumed++
	return nil
}

// AssumedClaimRestore forgets the claim's note: Get reads the cluster's.
func (c *Claims) AssumedClaimRestore(namespace, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.noted, namespace+"/"+name)
}

// Assumed is how many claims were noted.
func (c *Claims) Assumed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.assumed
}

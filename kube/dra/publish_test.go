package dra

import (
	"context"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/gpupool/gpupool/allocator/api"
)

// TestPublishWritesWhatChanged: the first sync creates a slice per
// server, owned by the DeviceClass; a sync of the same servers writes
// nothing, though kube-apiserver stamped the taints' time; a GPU gone
// unhealthy updates its server's slice, a new generation of its pool; a
// server without a healthy GPU, or gone, has its slice deleted; another
// driver's slice is never touched.
func TestPublishWritesWhatChanged(t *testing.T) {
	ctx := context.Background()
	other := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.example.com"}}
	kube := fake.NewClientset(other)
	owner := []metav1.OwnerReference{{APIVersion: "resource.k8s.io/v1", Kind: "DeviceClass", Name: DeviceClassName, UID: "class-uid"}}
	p := &publisher{kube: kube, owner: owner}
	sync := func(servers ...api.ServerStatus) writes {
		t.Helper()
		p.published = published(t, kube)
		w, err := p.sync(ctx, Slices(servers))
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	slice := func(server string) *resourceapi.ResourceSlice {
		t.Helper()
		s, err := kube.ResourceV1().ResourceSlices().Get(ctx, SliceName(server), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	a, b := server("gpu-a", "H100", 80*gi), server("gpu-b", "A100", 40*gi)
	if w := sync(a, b); w != (writes{created: 2}) {
		t.Fatalf("first sync: %+v, want 2 created", w)
	}
	if s := slice("gpu-a"); len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != "class-uid" || len(s.Spec.Devices) != 3 {
		t.Errorf("gpu-a's slice: owners %+v, %d devices; want the DeviceClass's, the 3 healthy GPUs", s.OwnerReferences, len(s.Spec.Devices))
	}

	// kube-apiserver stamps a taint's time.
	stamped := slice("gpu-a")
	for i := range stamped.Spec.Devices {
		stamped.Spec.Devices[i].Taints[0].TimeAdded = &metav1.Time{Time: time.Now()}
	}
	if _, err := kube.ResourceV1().ResourceSlices().Update(ctx, stamped, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if w := sync(a, b); w != (writes{}) {
		t.Errorf("the same servers again: %+v, want no write", w)
	}

	a.GPUs[1].Healthy = false
	for i := range b.GPUs {
		b.GPUs[i].Healthy = false
	}
	if w := sync(a, b); w != (writes{updated: 1, deleted: 1}) {
		t.Errorf("a GPU of gpu-a and all of gpu-b unhealthy: %+v, want gpu-a's updated, gpu-b's deleted", w)
	}
	if s := slice("gpu-a"); len(s.Spec.Devices) != 2 || s.Spec.Pool.Generation != 1 || len(s.OwnerReferences) != 1 {
		t.Errorf("gpu-a's slice: %d devices, generation %d, owners %+v; want 2, 1, the DeviceClass", len(s.Spec.Devices), s.Spec.Pool.Generation, s.OwnerReferences)
	}
	if w := sync(); w != (writes{deleted: 1}) {
		t.Errorf("no server: %+v, want gpu-a's deleted", w)
	}
	if _, err := kube.ResourceV1().ResourceSlices().Get(ctx, "other", metav1.GetOptions{}); err != nil {
		t.Errorf("another driver's slice: %v", err)
	}
}

// published lists the cluster's slices now, as the publisher's informer
// has them once synced.
func published(t *testing.T, kube *fake.Clientset) resourcelisters.ResourceSliceLister {
	t.Helper()
	list, err := kube.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	index := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for i := range list.Items {
		if err := index.Add(&list.Items[i]); err != nil {
			t.Fatal(err)
		}
	}
	return resourcelisters.NewResourceSliceLister(index)
}

package dra

import (
	"context"
	"errors"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/klog/v2"

	"github.com/gpupool/gpupool/allocator/client"
)

// Publish keeps the ResourceSlices of driver gpu.gpupool.io those of the
// allocator's servers (Slices) until ctx ends: it reads the pool every
// period and writes what differs from the slices published, as an
// informer has them. The slices are owned by the DeviceClass
// gpu.gpupool.io when it exists, so that deleting it (uninstalling)
// deletes them. A read of the pool that fails keeps the slices as they
// are.
func Publish(ctx context.Context, kube kubernetes.Interface, alloc *client.Client, every time.Duration) error {
	log := klog.FromContext(ctx)
	p := &publisher{kube: kube}
	class, err := kube.ResourceV1().DeviceClasses().Get(ctx, DeviceClassName, metav1.GetOptions{})
	switch {
	case err == nil:
		p.owner = []metav1.OwnerReference{{APIVersion: "resource.k8s.io/v1", Kind: "DeviceClass", Name: class.Name, UID: class.UID}}
	case apierrors.IsNotFound(err):
		log.Info("no DeviceClass "+DeviceClassName+": the ResourceSlices are published without an owner, and stay when gpupool is uninstalled", "driver", DriverName)
	default:
		return fmt.Errorf("DRA: reading DeviceClass %s: %w", DeviceClassName, err)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, DriverName).String()
	}))
	p.published = factory.Resource().V1().ResourceSlices().Lister()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for typ, synced := range factory.WaitForCacheSync(ctx.Done()) {
		if !synced {
			return fmt.Errorf("DRA: reading the published ResourceSlices (%v): %w", typ, ctx.Err())
		}
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		pool, err := alloc.Pool(ctx)
		if err != nil {
			log.Error(err, "DRA: reading the pool's servers: the ResourceSlices stay as they are")
		} else if w, err := p.sync(ctx, Slices(pool.Servers)); err != nil {
			log.Error(err, "DRA: publishing ResourceSlices", "created", w.created, "updated", w.updated, "deleted", w.deleted)
		} else if w != (writes{}) {
			log.Info("DRA: published the pool's GPUs as ResourceSlices", "driver", DriverName, "servers", len(pool.Servers),
				"created", w.created, "updated", w.updated, "deleted", w.deleted)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// publisher writes the pool's slices over those published.
type publisher struct {
	kube      kubernetes.Interface
	owner     []metav1.OwnerReference
	published resourcelisters.ResourceSliceLister
}

// writes counts a sync's writes.
type writes struct{ created, updated, deleted int }

// sync creates the slices wanted that are not published, updates those
// published otherwise (a new generation of their pool), and deletes the
// driver's other slices (servers gone, or without a healthy GPU). Every
// write is tried; the errors come back joined.
func (p *publisher) sync(ctx context.Context, want []resourceapi.ResourceSlice) (writes, error) {
	have, err := p.published.List(labels.Everything())
	if err != nil {
		return writes{}, err
	}
	byName := make(map[string]*resourceapi.ResourceSlice, len(have))
	for _, s := range have {
		if s.Spec.Driver == DriverName {
			byName[s.Name] = s
		}
	}
	slices := p.kube.ResourceV1().ResourceSlices()
	var w writes
	var errs []error
	for i := range want {
		s := &want[i]
		old, ok := byName[s.Name]
		delete(byName, s.Name)
		switch {
		case !ok:
			s.OwnerReferences = p.owner
			if _, err := slices.Create(ctx, s, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				errs = append(errs, err)
				continue
			}
			w.created++
		case !sameDevices(old, s):
			s.ObjectMeta = *old.ObjectMeta.DeepCopy()
			s.Spec.Pool.Generation = old.Spec.Pool.Generation + 1
			if _, err := slices.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
				errs = append(errs, err)
				continue
			}
			w.updated++
		}
	}
	for name := range byName {
		if err := slices.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
			continue
		}
		w.deleted++
	}
	return w, errors.Join(errs...)
}

// sameDevices reports whether the published slice old says what s does:
// the same node, pool and devices, the time kube-apiserver stamps on a
// taint aside.
func sameDevices(old, s *resourceapi.ResourceSlice) bool {
	was := old.Spec.DeepCopy()
	for i := range was.Devices {
		for k := range was.Devices[i].Taints {
			was.Devices[i].Taints[k].TimeAdded = nil
		}
	}
	was.Pool.Generation = s.Spec.Pool.Generation
	return equality.Semantic.DeepEqual(*was, s.Spec)
}

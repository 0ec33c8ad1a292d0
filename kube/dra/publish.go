package dra

import (
	"context"
	"fmt"
	"reflect"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/gpupool/gpupool/allocator/client"
)

// Publish keeps the ResourceSlices of driver gpu.gpupool.io those of the
// allocator's servers until ctx ends: it reads the pool every period and
// hands what changed to DRA's resourceslice controller, which writes the
// slices. They are owned by the DeviceClass gpu.gpupool.io when it
// exists, so that deleting it (uninstalling) deletes them. A read of the
// pool that fails keeps the slices as they are.
func Publish(ctx context.Context, kube kubernetes.Interface, alloc *client.Client, every time.Duration) error {
	log := klog.FromContext(ctx)
	opts := resourceslice.Options{DriverName: DriverName, KubeClient: kube}
	class, err := kube.ResourceV1().DeviceClasses().Get(ctx, DeviceClassName, metav1.GetOptions{})
	switch {
	case err == nil:
		opts.Owner = &resourceslice.Owner{APIVersion: "resource.k8s.io/v1", Kind: "DeviceClass", Name: class.Name, UID: class.UID}
	case apierrors.IsNotFound(err):
		log.Info("no DeviceClass "+DeviceClassName+": the ResourceSlices are published without an owner, and stay when gpupool is uninstalled", "driver", DriverName)
	default:
		return fmt.Errorf("DRA: reading DeviceClass %s: %w", DeviceClassName, err)
	}
	var published *resourceslice.Controller
	defer func() {
		if published != nil {
			published.Stop()
		}
	}()
	var last *resourceslice.DriverResources
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		pool, err := alloc.Pool(ctx)
		switch {
		case err != nil:
			log.Error(err, "DRA: reading the pool's servers: the ResourceSlices stay as they are")
		case published == nil:
			last = Resources(pool.Servers)
			opts.Resources = last
			if published, err = resourceslice.StartController(ctx, opts); err != nil {
				return fmt.Errorf("DRA: publishing ResourceSlices: %w", err)
			}
			log.Info("DRA: publishing the pool's GPUs as ResourceSlices", "driver", DriverName, "servers", len(last.Pools))
		default:
			if res := Resources(pool.Servers); !reflect.DeepEqual(res, last) {
				last = res
				published.Update(res)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

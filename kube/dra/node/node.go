// Package node is the node side of the pool's DRA driver: the kubelet
// plugin that prepares a claim of gpu.gpupool.io for a pod's containers.
// Preparing a claim writes a CDI spec that gives them what a container
// holding the claim's lease gets (gpuaccess.For: the same environment, MPS
// limits and simulated-GPU files as the device plugin's), and answers its
// CDI device; the container runtime applies it. The lease is the pod's,
// read from the allocator, and must be the one the claim's allocation
// names on this node: an allocation the pool did not write gets nothing.
package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdi "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/kube/dra"
	"github.com/gpupool/gpupool/kube/gpuaccess"
)

// CDIKind is the CDI kind of the devices the driver's specs describe: one
// device a claim, named by the claim's UID.
const CDIKind = dra.DriverName + "/claim"

// Leases finds the leases the allocator holds for a pod.
type Leases interface {
	PodLeases(ctx context.Context, namespace string, pod types.UID) ([]api.Lease, error)
}

// Driver prepares and unprepares the claims of its node's pods.
type Driver struct {
	// Node is the node's name, its GPU server's.
	Node   string
	Leases Leases
	// CDIDir is where the container runtime reads CDI specs
	// (/var/run/cdi).
	CDIDir string
	// Access is what the node gives every container holding a lease.
	Access gpuaccess.Node
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// PrepareResourceClaims prepares each claim: a CDI spec of its lease, and
// its devices, each with the spec's one CDI device.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	results := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		devices, err := d.prepare(ctx, c)
		results[c.UID] = kubeletplugin.PrepareResult{Devices: devices, Err: err}
	}
	return results, nil
}

func (d *Driver) prepare(ctx context.Context, c *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	lease, err := d.leaseOf(ctx, c)
	if err != nil {
		return nil, err
	}
	access, err := gpuaccess.For(lease, d.Access)
	if err != nil {
		return nil, fmt.Errorf("ResourceClaim %s/%s: %w", c.Namespace, c.Name, err)
	}
	if err := d.writeSpec(c.UID, access); err != nil {
		return nil, err
	}
	var devices []kubeletplugin.Device
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == dra.DriverName {
			devices = append(devices, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
				ShareID: r.ShareID, CDIDeviceIDs: []string{CDIKind + "=" + string(c.UID)}})
		}
	}
	return devices, nil
}

// leaseOf is the lease of the pod the claim is reserved for, which the
// claim's allocation must name, on this node.
func (d *Driver) leaseOf(ctx context.Context, c *resourceapi.ResourceClaim) (api.Lease, error) {
	name := c.Namespace + "/" + c.Name
	var pod types.UID
	for _, r := range c.Status.ReservedFor {
		if r.Resource == "pods" {
			pod = r.UID
		}
	}
	switch {
	case c.Status.Allocation == nil:
		return api.Lease{}, fmt.Errorf("ResourceClaim %s is not allocated", name)
	case pod == "":
		return api.Lease{}, fmt.Errorf("ResourceClaim %s is reserved for no pod", name)
	}
	leases, err := d.Leases.PodLeases(ctx, c.Namespace, pod)
	if err != nil {
		// The allocator may answer next time: the kubelet retries.
		return api.Lease{}, fmt.Errorf("%w: ResourceClaim %s: reading its pod's lease from the allocator: %w", kubeletplugin.ErrRecoverable, name, err)
	}
	i := slices.IndexFunc(leases, func(l api.Lease) bool { return dra.AllocatesLease(c.Status.Allocation, l) })
	switch {
	case i < 0:
		return api.Lease{}, fmt.Errorf("ResourceClaim %s: status.allocation names no lease the pool holds for its pod %s: the pool did not allocate it", name, pod)
	case leases[i].Server != d.Node:
		return api.Lease{}, fmt.Errorf("ResourceClaim %s: its lease %s is on %s, not on this node %s", name, leases[i].ID, leases[i].Server, d.Node)
	}
	return leases[i], nil
}

// UnprepareResourceClaims removes each claim's CDI spec.
func (d *Driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	results := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		err := os.Remove(d.specPath(c.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil // never prepared here, or unprepared already
		}
		results[c.UID] = err
	}
	return results, nil
}

// HandleError is told of the errors of the helper's background work
// (publishing slices, which this driver leaves to the control plane).
func (d *Driver) HandleError(context.Context, error, string) {}

// WatchHealthStatus: the pool's health reaches the allocator through the
// daemon's heartbeats, and the published slices through the control
// plane, not through the kubelet.
func (d *Driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func (d *Driver) specPath(claim types.UID) string {
	return filepath.Join(d.CDIDir, dra.DriverName+"-"+string(claim)+".json")
}

// writeSpec writes the claim's CDI spec, whole or not at all: the runtime
// may read the directory at any time.
func (d *Driver) writeSpec(claim types.UID, a gpuaccess.Access) error {
	dev := cdi.Device{Name: string(claim)}
	for _, k := range slices.Sorted(maps.Keys(a.Env)) {
		dev.ContainerEdits.Env = append(dev.ContainerEdits.Env, k+"="+a.Env[k])
	}
	for _, m := range a.Mounts {
		options := []string{"rbind"}
		if m.ReadOnly {
			options = append(options, "ro")
		}
		dev.ContainerEdits.Mounts = append(dev.ContainerEdits.Mounts, &cdi.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, Options: options})
	}
	// 0.6.0: what env and mounts need, so that older runtimes read it too.
	b, err := json.Marshal(cdi.Spec{Version: "0.6.0", Kind: CDIKind, Devices: []cdi.Device{dev}})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(d.CDIDir, 0o750); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(d.CDIDir, ".tmp-*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(b); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), d.specPath(claim))
}

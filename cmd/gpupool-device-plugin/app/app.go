// Package app runs gpupool-device-plugin from its Options: the kubelet
// device plugin of a GPU server (kube/deviceplugin).
package app

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/kubeconfig"
	"github.com/gpupool/gpupool/kube/deviceplugin"
	"github.com/gpupool/gpupool/kube/dra"
	"github.com/gpupool/gpupool/kube/dra/node"
	"github.com/gpupool/gpupool/kube/gpuaccess"
)

// Usage is what --help says above the flags.
const Usage = `Usage: gpupool-device-plugin --node NAME --allocator URL --token-file FILE [flags]

The kubelet device plugin of a GPU server, run by a DaemonSet beside
gpupool-server on every GPU node. It registers bitfusion.io/gpu with the
kubelet, in the cluster's unit (--unit, the webhook's): 100 devices per GPU
in percent, one in gpus. The GPUs and their health are the pool's view of
this node's server (the node's name), read every --poll: a GPU whose daemon
reports it unhealthy, or whose daemon stopped heart-beating, is unhealthy to
the kubelet too, which then leaves it out of the node's allocatable. The
plugin registers once the allocator has answered, and again whenever the
kubelet restarts (it makes kubelet.sock anew).

The kubelet's Allocate does not say which pod it is for. The plugin takes
the pod the kubelet is admitting: among the pods bound to this node with a
gpupool.io/lease annotation and not yet allocated, whose GPU container asks
for as many devices, the first bound (those bound when the kubelet started:
the first created). It checks with the allocator that the lease exists, is
the pod's own and on this node (else Allocate fails, and the kubelet fails
the pod with the message), marks the pod gpupool.io/allocated, and gives the
container the lease's environment: NVIDIA_VISIBLE_DEVICES and
CUDA_VISIBLE_DEVICES (the lease's GPU UUIDs), GPUPOOL_LEASE_ID,
GPUPOOL_SERVER, GPUPOOL_GPU_UUIDS, GPUPOOL_GPU_PERCENT,
GPUPOOL_GPU_MEMORY_BYTES, and for a fraction of a GPU
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, as
gpupool run gives its command. Before the container starts, the kubelet's
pod-resources API says which pod got the devices, and a container whose pod
is not the one matched does not start.

NVIDIA's container runtime mounts the GPUs NVIDIA_VISIBLE_DEVICES names: it
must be the nodes' default runtime. MPS's limits bind where the host runs
the MPS control daemon (--mps-pipe-dir, --mps-shm-dir); docs/kubernetes.md
says what the node needs.

With --dra it is also the kubelet plugin of Dynamic Resource Allocation's
driver gpu.gpupool.io: for a pod's ResourceClaim of DeviceClass
gpu.gpupool.io, which gpupool-kube-scheduler allocated from the pod's lease,
it writes a CDI spec in --cdi-dir giving the containers the same
environment and mounts, once it has checked with the allocator that the
pod's lease on this node is the one the allocation names. The container
runtime must read CDI specs there (containerd 2 does by default).
`

// Run serves the device plugin until ctx ends or it fails.
func Run(ctx context.Context, o *Options, log *slog.Logger) error {
	alloc, err := client.NewFromFlags(client.Flags{Allocator: o.Allocator, CAFile: o.AllocatorCAFile, TokenFile: o.TokenFile, TokenFlag: "--token-file"})
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	// Allocate holds up the kubelet's admission of every pod of the node
	// while it checks a lease: give up within seconds, and the pod fails
	// with the allocator named.
	alloc.Timeout = 5 * time.Second
	kubeClient, err := kubeconfig.Client(o.Kubeconfig, "gpupool-device-plugin", nil)
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	access := gpuaccess.Node{MPS: gpuaccess.MPS{PipeDir: o.MPSPipeDir, ShmDir: o.MPSShmDir}, SimulatedDeviceDir: o.SimulatedDeviceDir}
	plugin, err := deviceplugin.New(deviceplugin.Config{
		Node: o.Node, Unit: o.Unit, MaxDevices: o.MaxDevices, Allocator: alloc, Kube: kubeClient, Dir: o.PluginDir, PodResources: o.PodResourcesSocket,
		Poll: o.Poll, MPS: access.MPS, SimulatedDeviceDir: access.SimulatedDeviceDir, Logger: log,
	})
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	if o.DRA {
		// The helper serves its socket in the plugin's directory, which it
		// does not make.
		dataDir := filepath.Join(o.KubeletDir, "plugins", dra.DriverName)
		if err := os.MkdirAll(dataDir, 0o750); err != nil {
			return fmt.Errorf("the DRA kubelet plugin's directory: %w", err)
		}
		driver := &node.Driver{Node: o.Node, Leases: podLeases{alloc, o.Node}, CDIDir: o.CDIDir, Access: access}
		helper, err := kubeletplugin.Start(klog.NewContext(ctx, logr.FromSlogHandler(log.Handler())), driver,
			kubeletplugin.DriverName(dra.DriverName), kubeletplugin.NodeName(o.Node), kubeletplugin.KubeClient(kubeClient),
			kubeletplugin.RegistrarDirectoryPath(filepath.Join(o.KubeletDir, "plugins_registry")),
			kubeletplugin.PluginDataDirectoryPath(dataDir))
		if err != nil {
			return fmt.Errorf("the DRA kubelet plugin: %w", err)
		}
		defer helper.Stop()
		log.Info("DRA kubelet plugin serving", "driver", dra.DriverName, "kubelet-dir", o.KubeletDir, "cdi-dir", o.CDIDir)
	}
	log.Info("device plugin starting", "node", o.Node, "allocator", o.Allocator, "unit", o.Unit, "plugin-dir", o.PluginDir)
	return plugin.Run(ctx)
}

// podLeases reads a pod's leases on this node's server from the
// allocator, with the node's token.
type podLeases struct {
	alloc *client.Client
	node  string
}

func (p podLeases) PodLeases(ctx context.Context, namespace string, pod types.UID) ([]api.Lease, error) {
	return p.alloc.Leases(ctx, client.LeaseFilter{Server: p.node, Namespace: namespace, OwnerUID: string(pod)})
}

// Command is gpupool-device-plugin's command line: its options, and Run on them.
func Command() cli.Service {
	o := NewOptions()
	return cli.Service{Name: "gpupool-device-plugin", Usage: Usage, Options: o,
		Run: func(ctx context.Context, log *slog.Logger) error { return Run(ctx, o, log) }}
}

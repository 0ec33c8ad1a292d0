// Command gpupool-device-plugin is the kubelet device plugin of a GPU
// server: it advertises bitfusion.io/gpu on its node and gives each
// container that asks the GPUs of its pod's lease (kube/deviceplugin).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/kubeconfig"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/deviceplugin"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpupool-device-plugin", flag.ContinueOnError)
	node := fs.String("node", os.Getenv("NODE_NAME"), "this node's name, which is its GPU server's name in the pool (env NODE_NAME, from the downward API's spec.nodeName)")
	allocatorURL := fs.String("allocator", "http://127.0.0.1:8470", "allocator address(es), comma-separated")
	caFile := cli.AddAllocatorCAFlag(fs)
	tokenFile := fs.String("token-file", "", "file holding the allocator's servers token (a per-server token of this node will do): it reads this node's server and the leases on it")
	unitName := fs.String("unit", string(kube.UnitPercent), "what one bitfusion.io/gpu stands for, the webhook's --unit: percent (100 devices per GPU) or gpus (one per GPU)")
	kubeconfigPath := fs.String("kubeconfig", "", "kubeconfig of the cluster; empty uses the in-cluster config")
	dir := fs.String("plugin-dir", "/var/lib/kubelet/device-plugins", "the kubelet's device-plugin directory: its kubelet.sock, and the plugin's "+deviceplugin.Socket)
	podResources := fs.String("pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock", "the kubelet's pod-resources socket, asked before a container starts which pod its devices went to; empty skips that check")
	poll := fs.Duration("poll", 10*time.Second, "how often the node's GPUs and their health are read from the allocator")
	mpsPipeDir := fs.String("mps-pipe-dir", "", "the host's MPS control daemon's pipe directory (its CUDA_MPS_PIPE_DIRECTORY), mounted into every container at the same path; empty: no MPS")
	mpsShmDir := fs.String("mps-shm-dir", "", "the host directory holding the MPS daemon's shared memory, mounted as every container's /dev/shm")
	simulatedDeviceDir := fs.String("simulated-device-dir", "", "on a node without GPUs, the directory where gpupool-server --source simulated makes the files that stand for them (its --simulated-device-dir): each container gets its lease's at "+kube.SimulatedDeviceDir+"/<UUID>; tests and demos only")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: gpupool-device-plugin --node NAME --allocator URL --token-file FILE [flags]

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

Flags:
`)
		fs.PrintDefaults()
	}
	if exit, ok := cli.Parse(fs, args, stdout, stderr); !ok {
		return exit
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	bad := func(err error) int {
		log.Error("bad flag", "err", err)
		return cli.ExitUsage
	}
	if *node == "" {
		return bad(fmt.Errorf("--node is required (or NODE_NAME)"))
	}
	if *poll <= 0 {
		return bad(fmt.Errorf("--poll %s: must be above 0", *poll))
	}
	unit, err := kube.ParseUnit(*unitName)
	if err != nil {
		return bad(fmt.Errorf("--unit: %w", err))
	}
	token, err := cli.ReadToken(*tokenFile)
	if err != nil {
		return bad(fmt.Errorf("--token-file: %w", err))
	}
	alloc, err := client.New([]string{*allocatorURL}, token)
	if err != nil {
		return bad(fmt.Errorf("--allocator: %w", err))
	}
	if err := alloc.TrustCAFile(*caFile); err != nil {
		return bad(fmt.Errorf("--allocator-ca-file: %w", err))
	}
	// Allocate holds up the kubelet's admission of every pod of the node
	// while it checks a lease: give up within seconds, and the pod fails
	// with the allocator named.
	alloc.Timeout = 5 * time.Second
	kubeConfig, err := kubeconfig.Load(*kubeconfigPath)
	if err != nil {
		return bad(fmt.Errorf("no cluster (--kubeconfig, or run in a pod): %w", err))
	}
	kubeConfig.UserAgent = "gpupool-device-plugin"
	kubeClient, err := kubernetes.NewForConfig(kubeConfig)
	if err != nil {
		return bad(fmt.Errorf("--kubeconfig: %w", err))
	}
	plugin, err := deviceplugin.New(deviceplugin.Config{
		Node: *node, Unit: unit, Allocator: alloc, Kube: kubeClient, Dir: *dir, PodResources: *podResources,
		Poll: *poll, MPS: deviceplugin.MPS{PipeDir: *mpsPipeDir, ShmDir: *mpsShmDir}, SimulatedDeviceDir: *simulatedDeviceDir, Logger: log,
	})
	if err != nil {
		return bad(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.Info("device plugin starting", "node", *node, "allocator", *allocatorURL, "unit", unit, "plugin-dir", *dir)
	if err := plugin.Run(ctx); err != nil {
		log.Error("stopping", "err", err)
		return 1
	}
	return 0
}

package app

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/admission"
	"github.com/gpupool/gpupool/kube/deviceplugin"
	"github.com/gpupool/gpupool/kube/dra"
)

// Options are gpupool-device-plugin's flags.
type Options struct {
	// Node is this node's name, its GPU server's name in the pool.
	Node string
	// Allocator is one address or several, comma-separated.
	Allocator, AllocatorCAFile, TokenFile string
	Kubeconfig                            string
	PluginDir, PodResourcesSocket         string
	Poll                                  time.Duration
	MPSPipeDir, MPSShmDir                 string
	SimulatedDeviceDir                    string
	MaxDevices                            int
	// DRA serves the kubelet plugin of DRA's driver gpu.gpupool.io too,
	// registered in KubeletDir, its claims' CDI specs in CDIDir.
	DRA                bool
	KubeletDir, CDIDir string
	// UnitFlags are --unit alone: the plugin counts no GPU memory.
	admission.UnitFlags
}

// NewOptions returns the defaults; the node's name is NODE_NAME's, which
// the DaemonSet sets from the downward API.
func NewOptions() *Options {
	return &Options{
		Node: os.Getenv("NODE_NAME"), Allocator: "http://127.0.0.1:8470", UnitFlags: admission.UnitFlags{UnitName: string(kube.UnitPercent)},
		PluginDir: "/var/lib/kubelet/device-plugins", PodResourcesSocket: "/var/lib/kubelet/pod-resources/kubelet.sock",
		Poll: 10 * time.Second, KubeletDir: "/var/lib/kubelet", CDIDir: "/var/run/cdi",
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Node, "node", o.Node, "this node's name, which is its GPU server's name in the pool (env NODE_NAME, from the downward API's spec.nodeName)")
	fs.StringVar(&o.Allocator, "allocator", o.Allocator, "allocator address(es), comma-separated")
	cli.AllocatorCAFlagVar(fs, &o.AllocatorCAFile)
	fs.StringVar(&o.TokenFile, "token-file", o.TokenFile, "file holding the allocator's servers token (a per-server token of this node will do): it reads this node's server and the leases on it")
	o.AddUnitFlag(fs, "what one bitfusion.io/gpu stands for, the webhook's --unit: percent (100 devices per GPU), gpus (one per GPU) or memory:<size> (as many as whole slices of a GPU's memory)")
	fs.IntVar(&o.MaxDevices, "max-devices", o.MaxDevices, "the most bitfusion.io/gpu this node offers (BFK's allocatable): the devices of its GPUs beyond it are not offered; 0 offers all")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig of the cluster; empty uses the in-cluster config")
	fs.StringVar(&o.PluginDir, "plugin-dir", o.PluginDir, "the kubelet's device-plugin directory: its kubelet.sock, and the plugin's "+deviceplugin.Socket)
	fs.StringVar(&o.PodResourcesSocket, "pod-resources-socket", o.PodResourcesSocket, "the kubelet's pod-resources socket, asked before a container starts which pod its devices went to; empty skips that check")
	fs.DurationVar(&o.Poll, "poll", o.Poll, "how often the node's GPUs and their health are read from the allocator")
	fs.StringVar(&o.MPSPipeDir, "mps-pipe-dir", o.MPSPipeDir, "the host's MPS control daemon's pipe directory (its CUDA_MPS_PIPE_DIRECTORY), mounted into every container at the same path; empty: no MPS")
	fs.StringVar(&o.MPSShmDir, "mps-shm-dir", o.MPSShmDir, "the host directory holding the MPS daemon's shared memory, mounted as every container's /dev/shm")
	fs.BoolVar(&o.DRA, "dra", o.DRA, "serve the kubelet plugin of Dynamic Resource Allocation's driver "+dra.DriverName+" too: it prepares the node's pods' ResourceClaims of DeviceClass "+dra.DeviceClassName+", each a CDI spec in --cdi-dir that gives the containers what the device plugin gives them")
	fs.StringVar(&o.KubeletDir, "kubelet-dir", o.KubeletDir, "the kubelet's root directory (with --dra: the plugin registers in its plugins_registry and serves from plugins/"+dra.DriverName+")")
	fs.StringVar(&o.CDIDir, "cdi-dir", o.CDIDir, "with --dra, where the container runtime reads CDI specs (containerd 2's default: /var/run/cdi)")
	fs.StringVar(&o.SimulatedDeviceDir, "simulated-device-dir", o.SimulatedDeviceDir, "on a node without GPUs, the directory where gpupool-server --source simulated makes the files that stand for them (its --simulated-device-dir): each container gets its lease's at "+kube.SimulatedDeviceDir+"/<UUID>; tests and demos only")
}

// Validate checks the options and parses the unit.
func (o *Options) Validate() error {
	if o.Node == "" {
		return errors.New("--node is required (or NODE_NAME)")
	}
	if o.Poll <= 0 {
		return fmt.Errorf("--poll %s: must be above 0", o.Poll)
	}
	if o.DRA && (o.KubeletDir == "" || o.CDIDir == "") {
		return fmt.Errorf("--dra needs --kubelet-dir (%q) and --cdi-dir (%q)", o.KubeletDir, o.CDIDir)
	}
	if o.MaxDevices < 0 {
		return fmt.Errorf("--max-devices %d: must be 0 (all) or more", o.MaxDevices)
	}
	return o.ValidateUnit()
}

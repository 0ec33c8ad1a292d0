package app

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/collector"
	"github.com/gpupool/gpupool/fakegpu"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/inventory"
)

// Options are gpupool-server's flags.
type Options struct {
	// Name is the server's name in the pool.
	Name string
	// Allocator is one address or several, comma-separated.
	Allocator, AllocatorCAFile                        string
	Listen, ProbeListen, AdvertiseHost, ProcessSocket string
	// Source is one of collector.Sources.
	Source, DCGMURL string
	// SimulateGPUs, SimulateTopology, Seed, SimulatedDeviceDir and
	// SimulatedWorkload make the simulated GPUs (--source simulated).
	SimulateGPUs, SimulateTopology        string
	Seed                                  uint64
	SimulatedDeviceDir, SimulatedWorkload string
	Interval, Heartbeat                   time.Duration
	ProcessEvery                          int
	// LabelsAllowlist is the pod labels copied onto per-lease series,
	// comma-separated.
	LabelsAllowlist string
	CPUMilli        int64
	Sysfs           string
	// Tokens are --token-file and --token; a caller that sets the options
	// in code gives cli.TokenFile.
	Tokens *cli.TokenFlags
	// SimulatedDemand, which no flag sets, drives the simulated GPUs where
	// no --simulated-workload does: how busy each lease keeps its share at
	// a time (fakegpu.Source.Demand), for a caller that simulates its
	// workload in code (gpupool-demo).
	SimulatedDemand func(leases []allocator.Lease, t time.Time) map[string]float64

	// simulatedGPUs and simulatedTopology are SimulateGPUs and
	// SimulateTopology, parsed by Validate.
	simulatedGPUs     []fakegpu.GPU
	simulatedTopology inventory.Topology
	// flags is where AddFlags registered the options, to tell a flag
	// left at its default from one set to it.
	flags *flag.FlagSet
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	hostname, _ := os.Hostname()
	return &Options{
		Name: defaultName(hostname), Allocator: cli.EnvOr("GPUPOOL_ALLOCATOR", "http://127.0.0.1:8470"),
		Listen: "127.0.0.1:8471", ProbeListen: "127.0.0.1:8472", ProcessSocket: defaultProcessSocket,
		Source: collector.SourceSimulated, DCGMURL: "http://127.0.0.1:9400/metrics",
		SimulateGPUs: "H100:80Gi:8", SimulateTopology: "nvswitch", Seed: 1,
		Interval: time.Second, ProcessEvery: 5, Heartbeat: 5 * time.Second, LabelsAllowlist: "app", Sysfs: "/sys",
		Tokens: &cli.TokenFlags{},
	}
}

// defaultName is the default server name: the host name lowercased, as the
// kubelet names its node (node names are lowercase DNS subdomains, and the
// allocator refuses other server names).
func defaultName(host string) string { return strings.ToLower(host) }

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	o.flags = fs
	fs.StringVar(&o.Name, "name", o.Name, "server name in the pool (default: the host name, lowercased, as the kubelet names nodes)")
	fs.StringVar(&o.Allocator, "allocator", o.Allocator, "allocator URL; replicas comma-separated (env GPUPOOL_ALLOCATOR)")
	cli.AllocatorCAFlagVar(fs, &o.AllocatorCAFile)
	o.Tokens = cli.AddTokenFlags(fs, "the servers group's bearer token, or this server's own")
	fs.StringVar(&o.Listen, "listen", o.Listen, "address of /metrics, /healthz and /v1/usage")
	fs.StringVar(&o.ProcessSocket, "process-socket", o.ProcessSocket, "Unix socket where `gpupool run` on this host reports the processes of its leases; <name> is --name; empty: take no reports (processes in pods are still attributed by their pod)")
	fs.StringVar(&o.ProbeListen, "probe-listen", o.ProbeListen, "address where clients probe the data-path round trip (TCP)")
	fs.StringVar(&o.AdvertiseHost, "advertise-host", o.AdvertiseHost, "host clients reach this server at (default: the listen address's host, or the host name when it listens on all interfaces)")
	fs.StringVar(&o.Source, "source", o.Source, "telemetry source: simulated (no GPU needed), nvml, or dcgm (a dcgm-exporter's /metrics)")
	fs.StringVar(&o.DCGMURL, "dcgm-url", o.DCGMURL, "dcgm-exporter /metrics URL (--source dcgm)")
	fs.StringVar(&o.SimulateGPUs, "simulate-gpus", o.SimulateGPUs, "simulated GPUs as model:memory:count (--source simulated)")
	fs.StringVar(&o.SimulateTopology, "simulate-topology", o.SimulateTopology, "how the simulated GPUs link to each other: nvswitch (every pair NVLink, as the 8 H100s of an HGX board, the default GPUs), "+
		"pcie (no NVLink; two GPUs behind each PCIe switch, two switches per CPU socket, in GPU order: 0-3 on one socket, 4-7 on the next), or none (unknown, as a dcgm-exporter source) (--source simulated)")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed of the simulated GPUs")
	fs.StringVar(&o.SimulatedDeviceDir, "simulated-device-dir", o.SimulatedDeviceDir, "directory where the daemon makes each simulated GPU a file named by its UUID, which real processes hold open as CUDA processes hold /dev/nvidiaN: the processes on a GPU are those holding its file, each running its pod's lease's work; empty: each lease runs one made-up process (--source simulated)")
	fs.StringVar(&o.SimulatedWorkload, "simulated-workload", o.SimulatedWorkload, "YAML list of workloads {namespace, selector, gpus} that keep the simulated GPUs busy; reread when it changes (--source simulated)")
	fs.DurationVar(&o.Interval, "interval", o.Interval, "time between sampling rounds")
	fs.IntVar(&o.ProcessEvery, "process-every", o.ProcessEvery, "read per-process use every this many rounds (the expensive call)")
	fs.DurationVar(&o.Heartbeat, "heartbeat", o.Heartbeat, "time between heartbeats to the allocator")
	fs.StringVar(&o.LabelsAllowlist, "metric-labels-allowlist", o.LabelsAllowlist, "pod labels copied onto per-lease series, comma-separated")
	fs.Int64Var(&o.CPUMilli, "cpu-milli", o.CPUMilli, "CPU the host offers to leases, in millicores (0: not accounted)")
	fs.StringVar(&o.Sysfs, "sysfs", o.Sysfs, "sysfs mount point, for InfiniBand/RoCE port counters (skipped when it has no class/infiniband)")
}

// Validate checks the options and, for --source simulated, parses the
// simulated GPUs and reads the workload file once, so that a bad one
// stops the daemon before it registers.
func (o *Options) Validate() error {
	switch {
	case o.Source != collector.SourceSimulated && o.Source != collector.SourceNVML && o.Source != collector.SourceDCGM:
		return fmt.Errorf("--source %q is not one of %s", o.Source, collector.Sources)
	case o.SimulatedDeviceDir != "" && o.Source != collector.SourceSimulated:
		return errors.New("--simulated-device-dir needs --source simulated")
	case o.Interval <= 0:
		return fmt.Errorf("--interval %v: must be more than 0", o.Interval)
	case o.Heartbeat <= 0:
		return fmt.Errorf("--heartbeat %v: must be more than 0", o.Heartbeat)
	case o.Source != collector.SourceSimulated:
		return nil
	}
	gpus, err := fakegpu.ParseGPUs(o.SimulateGPUs)
	if err != nil {
		return fmt.Errorf("--simulate-gpus: %w", err)
	}
	if o.simulatedTopology, err = fakegpu.ParseTopology(o.SimulateTopology, len(gpus)); err != nil {
		return fmt.Errorf("--simulate-topology: %w", err)
	}
	o.simulatedGPUs = gpus
	if o.SimulatedWorkload != "" {
		if _, _, err := fakegpu.ReadWorkloads(o.SimulatedWorkload); err != nil {
			return fmt.Errorf("--simulated-workload: %w", err)
		}
	}
	return nil
}

// isSet is whether the flag was given on the command line, not left at
// its default.
func (o *Options) isSet(name string) bool {
	set := false
	if o.flags != nil {
		o.flags.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	}
	return set
}

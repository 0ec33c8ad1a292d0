// Command gpupool-server is the GPU-server daemon: one per GPU host.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/collector"
	"github.com/gpupool/gpupool/gpuserver"
	gpuapi "github.com/gpupool/gpupool/gpuserver/api"
	"github.com/gpupool/gpupool/internal/cli"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpupool-server", flag.ContinueOnError)
	hostname, _ := os.Hostname()
	name := fs.String("name", defaultName(hostname), "server name in the pool (default: the host name, lowercased, as the kubelet names nodes)")
	allocatorURL := fs.String("allocator", cli.EnvOr("GPUPOOL_ALLOCATOR", "http://127.0.0.1:8470"), "allocator URL; replicas comma-separated (env GPUPOOL_ALLOCATOR)")
	caFile := cli.AddAllocatorCAFlag(fs)
	tokens := cli.AddTokenFlags(fs, "the servers group's bearer token, or this server's own")
	listen := fs.String("listen", "127.0.0.1:8471", "address of /metrics, /healthz and /v1/usage")
	processSocket := fs.String("process-socket", defaultProcessSocket, "Unix socket where `gpupool run` on this host reports the processes of its leases; <name> is --name; empty: take no reports (processes in pods are still attributed by their pod)")
	probeListen := fs.String("probe-listen", "127.0.0.1:8472", "address where clients probe the data-path round trip (TCP)")
	advertise := fs.String("advertise-host", "", "host clients reach this server at (default: the listen address's host, or the host name when it listens on all interfaces)")
	source := fs.String("source", "simulated", "telemetry source: simulated (no GPU needed), nvml, or dcgm (a dcgm-exporter's /metrics)")
	dcgmURL := fs.String("dcgm-url", "http://127.0.0.1:9400/metrics", "dcgm-exporter /metrics URL (--source dcgm)")
	simulate := fs.String("simulate-gpus", "H100:80Gi:8", "simulated GPUs as model:memory:count (--source simulated)")
	simTopology := fs.String("simulate-topology", "nvswitch", "how the simulated GPUs link to each other: nvswitch (every pair NVLink, as the 8 H100s of an HGX board, the default GPUs), "+
		"pcie (no NVLink; two GPUs behind each PCIe switch, two switches per CPU socket, in GPU order: 0-3 on one socket, 4-7 on the next), or none (unknown, as a dcgm-exporter source) (--source simulated)")
	seed := fs.Uint64("seed", 1, "seed of the simulated GPUs")
	deviceDir := fs.String("simulated-device-dir", "", "directory where the daemon makes each simulated GPU a file named by its UUID, which real processes hold open as CUDA processes hold /dev/nvidiaN: the processes on a GPU are those holding its file, each running its pod's lease's work; empty: each lease runs one made-up process (--source simulated)")
	workload := fs.String("simulated-workload", "", "YAML list of workloads {namespace, selector, gpus} that keep the simulated GPUs busy; reread when it changes (--source simulated)")
	interval := fs.Duration("interval", time.Second, "time between sampling rounds")
	processEvery := fs.Int("process-every", 5, "read per-process use every this many rounds (the expensive call)")
	heartbeat := fs.Duration("heartbeat", 5*time.Second, "time between heartbeats to the allocator")
	allowlist := fs.String("metric-labels-allowlist", "app", "pod labels copied onto per-lease series, comma-separated")
	cpu := fs.Int64("cpu-milli", 0, "CPU the host offers to leases, in millicores (0: not accounted)")
	sysPath := fs.String("sysfs", "/sys", "sysfs mount point, for InfiniBand/RoCE port counters (skipped when it has no class/infiniband)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: gpupool-server [flags]

The GPU-server daemon, one per GPU host: it registers the host's GPUs with the
allocator and heart-beats, samples them on its own loop (NVML, a
dcgm-exporter, or simulated GPUs for a machine without one), attributes what
each lease really uses from its processes, measures clients' round trips,
and serves /metrics, /healthz and /v1/usage. Processes started by
"gpupool run" on this host report themselves on --process-socket.

  gpupool-server --source nvml --allocator http://allocator:8470

Flags:
`)
		fs.PrintDefaults()
	}
	if exit, ok := cli.Parse(fs, args, stdout, stderr); !ok {
		return exit
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	token, warning, err := tokens.Token()
	if err != nil {
		log.Error("bad flag", "err", err)
		return cli.ExitUsage
	}
	if warning != "" {
		log.Warn(warning)
	}
	allocatorURLs := []string{*allocatorURL}
	cl, err := client.New(allocatorURLs, token)
	if err == nil {
		err = cl.TrustCAFile(*caFile)
	}
	if err != nil {
		log.Error("bad flag", "err", err)
		return cli.ExitUsage
	}
	if *deviceDir != "" && *source != "simulated" {
		log.Error("bad flag", "err", "--simulated-device-dir needs --source simulated")
		return cli.ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Error("listening", "err", err)
		return 1
	}
	var src collector.Source
	var inv allocator.Server
	switch *source {
	case "simulated":
		gpus, err := collector.ParseSimulatedGPUs(*simulate)
		if err != nil {
			log.Error("bad flag", "err", err)
			return cli.ExitUsage
		}
		topology, err := collector.ParseSimulatedTopology(*simTopology, len(gpus))
		if err != nil {
			log.Error("bad flag", "err", fmt.Sprintf("--simulate-topology: %v", err))
			return cli.ExitUsage
		}
		sim := &collector.Simulated{Server: *name, Seed: *seed, GPUs: gpus, Topology: topology}
		if *workload != "" {
			if _, _, err := collector.ReadWorkloads(*workload); err != nil {
				log.Error("bad flag", "err", fmt.Sprintf("--simulated-workload: %v", err))
				return cli.ExitUsage
			}
			sim.Demand = (&collector.WorkloadFile{Path: *workload}).Demand
		}
		if *deviceDir != "" {
			sim.DeviceDir = *deviceDir
			if err := sim.CreateDeviceFiles(); err != nil {
				log.Error("creating the simulated GPUs", "err", err)
				return 1
			}
		}
		src, inv = sim, sim.Inventory(*cpu, 0, nil)
	case "nvml":
		nv, err := collector.OpenNVML()
		if err != nil {
			log.Error("starting the NVML source", "err", err)
			return 1
		}
		defer nv.Close() // after the sampler stopped: Serve returns then
		if inv, err = nv.Inventory(*name); err != nil {
			log.Error("reading the GPUs", "err", err)
			return 1
		}
		if err := nv.TopologyErr(); err != nil {
			log.Warn("the GPUs' links are unknown: the allocator places on this server as if every pair were across sockets", "err", err)
		}
		inv.CPUMilli = *cpu
		src = nv
	case "dcgm":
		dc := &collector.DCGM{URL: *dcgmURL, Client: &http.Client{Timeout: 5 * time.Second}}
		for {
			r, err := dc.Sample(ctx, false)
			if err == nil && len(r.GPUs) > 0 {
				inv = collector.Inventory(*name, r.GPUs)
				break
			}
			log.Warn("waiting for dcgm-exporter", "url", *dcgmURL, "err", err, "gpus", len(r.GPUs))
			select {
			case <-ctx.Done():
				return 0
			case <-time.After(5 * time.Second):
			}
		}
		inv.CPUMilli = *cpu
		src = dc
	default:
		log.Error("bad flag", "err", fmt.Sprintf("--source %q is not one of simulated, nvml, dcgm", *source))
		return cli.ExitUsage
	}
	probeLn, err := net.Listen("tcp", *probeListen)
	if err != nil {
		log.Error("listening for probes", "err", err)
		return 1
	}
	inv.Labels = map[string]string{
		gpuapi.LabelDaemonURL:    "http://" + advertised(ln.Addr(), *advertise),
		gpuapi.LabelProbeAddress: advertised(probeLn.Addr(), *advertise),
	}
	explicitSocket := false
	fs.Visit(func(f *flag.Flag) { explicitSocket = explicitSocket || f.Name == "process-socket" })
	processLn, socketPath, err := listenProcessSocket(*processSocket, *name, explicitSocket, log)
	if err != nil {
		log.Error("listening for process reports (set --process-socket to a path this user may create, or to \"\" to take no reports)", "err", err)
		return 1
	}
	if processLn != nil {
		defer func() { _ = processLn.Close() }() // removes the socket however run returns
		inv.Labels[gpuapi.LabelProcessSocket] = socketPath
	}
	host, err := gpuserver.NewHost(gpuserver.HostConfig{
		Config: gpuserver.Config{Inventory: inv, Client: cl, AllocatorURLs: allocatorURLs, Heartbeat: *heartbeat,
			LabelAllowlist: splitList(*allowlist), Log: log},
		Source: src, Interval: *interval, ProcessEvery: *processEvery, Proc: "/proc", Sysfs: *sysPath,
	})
	if err != nil {
		log.Error("assembling the daemon", "err", err)
		return 1
	}
	host.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	log.Info("gpu server serving", "server", *name, "address", "http://"+ln.Addr().String(), "process_socket", socketPath,
		"source", src.Name(), "gpus", len(inv.GPUs))
	if err := host.Serve(ctx, gpuserver.Listeners{HTTP: ln, Probes: probeLn, ProcessSocket: processLn}); err != nil {
		log.Error("serving", "err", err)
		return 1
	}
	return 0
}

// defaultProcessSocket is named after the server, so that daemons sharing a
// host (tests, simulations) do not share a socket.
const defaultProcessSocket = "/run/gpupool/<name>.sock"

// defaultSocketDir is where defaultProcessSocket lies; tests move it.
var defaultSocketDir = "/run/gpupool"

// defaultName is the default server name: the host name lowercased, as the
// kubelet names its node (node names are lowercase DNS subdomains, and the
// allocator refuses other server names).
func defaultName(host string) string { return strings.ToLower(host) }

// listenProcessSocket listens on the --process-socket flag's value (for
// the server name), and returns the listener and the socket's path; nil
// and no error when there is no socket to listen on: the flag is empty,
// or it was left at its default and the socket cannot be created there (a
// daemon not run as root cannot create /run/gpupool), which is logged as
// a warning: reports are then off, and processes are attributed by their
// pod only. A socket the user asked for that cannot be created is an
// error.
func listenProcessSocket(flagValue, name string, explicit bool, log *slog.Logger) (net.Listener, string, error) {
	if flagValue == "" {
		return nil, "", nil
	}
	if flagValue == defaultProcessSocket {
		flagValue = filepath.Join(defaultSocketDir, name+".sock")
	}
	path, err := filepath.Abs(flagValue)
	if err != nil {
		return nil, "", err
	}
	ln, err := gpuserver.ListenProcessSocket(path)
	if err != nil && !explicit {
		log.Warn("process reports are off: cannot create the default process socket; `gpupool run` cannot report its processes, which are attributed by their pod only. "+
			"To take reports, set --process-socket to a path this user may create (or run as root); to silence this, set --process-socket \"\"",
			"path", path, "err", err)
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	return ln, path, nil
}

// advertised is the host:port clients use for a listener: the given host,
// else the listen host unless it is every interface, else the host name.
func advertised(addr net.Addr, host string) string {
	h, port, _ := net.SplitHostPort(addr.String())
	if host == "" {
		host = h
		if ip := net.ParseIP(h); ip == nil || ip.IsUnspecified() {
			host, _ = os.Hostname()
		}
	}
	return net.JoinHostPort(host, port)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

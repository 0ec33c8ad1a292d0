// Package app runs gpupool-server, the GPU-server daemon, from its
// Options: a telemetry source (collector.Open) under a gpuserver.Host.
package app

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/collector"
	"github.com/gpupool/gpupool/fakegpu"
	"github.com/gpupool/gpupool/gpuserver"
	gpuapi "github.com/gpupool/gpupool/gpuserver/api"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/inventory"
)

// Usage is what --help says above the flags.
const Usage = `Usage: gpupool-server [flags]

The GPU-server daemon, one per GPU host: it registers the host's GPUs with the
allocator and heart-beats, samples them on its own loop (NVML, a
dcgm-exporter, or simulated GPUs for a machine without one), attributes what
each lease really uses from its processes, measures clients' round trips,
and serves /metrics, /healthz and /v1/usage. Processes started by
"gpupool run" on this host report themselves on --process-socket.

  gpupool-server --source nvml --allocator http://allocator:8470
`

// Run opens the telemetry source and serves the host's daemon until ctx
// ends or a server fails. Stopped while it waits for a dcgm-exporter, it
// returns nil.
func Run(ctx context.Context, o *Options, log *slog.Logger) error {
	cl, err := o.allocatorClient(log)
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	defer func() { _ = ln.Close() }()
	src, err := collector.Open(ctx, o.sourceConfig(log))
	switch {
	case err != nil && ctx.Err() != nil:
		return nil
	case err != nil:
		return err
	}
	defer src.Close() // after the sampler stopped: Serve returns then
	probeLn, err := net.Listen("tcp", o.ProbeListen)
	if err != nil {
		return fmt.Errorf("listening for probes: %w", err)
	}
	defer func() { _ = probeLn.Close() }()
	inv := src.Inventory
	inv.Labels = map[string]string{
		gpuapi.LabelDaemonURL:    "http://" + advertised(ln.Addr(), o.AdvertiseHost),
		gpuapi.LabelProbeAddress: advertised(probeLn.Addr(), o.AdvertiseHost),
	}
	processLn, socketPath, err := listenProcessSocket(o.ProcessSocket, o.Name, o.isSet("process-socket"), log)
	if err != nil {
		return fmt.Errorf("listening for process reports (set --process-socket to a path this user may create, or to \"\" to take no reports): %w", err)
	}
	if processLn != nil {
		defer func() { _ = processLn.Close() }() // removes the socket however Run returns
		inv.Labels[gpuapi.LabelProcessSocket] = socketPath
	}
	host, err := gpuserver.NewHost(gpuserver.HostConfig{
		Config: gpuserver.Config{Inventory: inv, Client: cl, AllocatorURLs: []string{o.Allocator}, Heartbeat: o.Heartbeat,
			LabelAllowlist: splitList(o.LabelsAllowlist), Log: log},
		Source: src.Source, Interval: o.Interval, ProcessEvery: o.ProcessEvery, Proc: "/proc", Sysfs: o.Sysfs,
	})
	if err != nil {
		return fmt.Errorf("assembling the daemon: %w", err)
	}
	host.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	log.Info("gpu server serving", "server", o.Name, "address", "http://"+ln.Addr().String(), "process_socket", socketPath,
		"source", src.Source.Name(), "gpus", len(inv.GPUs))
	if err := host.Serve(ctx, gpuserver.Listeners{HTTP: ln, Probes: probeLn, ProcessSocket: processLn}); err != nil {
		return fmt.Errorf("serving: %w", err)
	}
	return nil
}

// allocatorClient is the allocator's client with the token the flags
// name; a token given on the command line is warned about.
func (o *Options) allocatorClient(log *slog.Logger) (*client.Client, error) {
	token, warning, err := o.Tokens.Token()
	if err != nil {
		return nil, err
	}
	if warning != "" {
		log.Warn(warning)
	}
	cl, err := client.New([]string{o.Allocator}, token)
	if err != nil {
		return nil, fmt.Errorf("--allocator: %w", err)
	}
	if err := cl.TrustCAFile(o.AllocatorCAFile); err != nil {
		return nil, fmt.Errorf("--%s: %w", cli.AllocatorCAFlag, err)
	}
	return cl, nil
}

// sourceConfig is the telemetry source the options name.
func (o *Options) sourceConfig(log *slog.Logger) collector.SourceConfig {
	return collector.SourceConfig{Kind: o.Source, Server: o.Name, CPUMilli: o.CPUMilli, DCGMURL: o.DCGMURL,
		Simulated: o.openSimulated, Log: log}
}

// openSimulated makes the simulated GPUs of the options (validated), and
// their device files when asked for.
func (o *Options) openSimulated() (collector.Source, inventory.Server, error) {
	sim := &fakegpu.Source{Server: o.Name, Seed: o.Seed, GPUs: o.simulatedGPUs, Topology: o.simulatedTopology,
		DeviceDir: o.SimulatedDeviceDir, Demand: o.SimulatedDemand}
	if o.SimulatedWorkload != "" {
		sim.Demand = (&fakegpu.WorkloadFile{Path: o.SimulatedWorkload}).Demand
	}
	if sim.DeviceDir != "" {
		if err := sim.CreateDeviceFiles(); err != nil {
			return nil, inventory.Server{}, fmt.Errorf("creating the simulated GPUs: %w", err)
		}
	}
	return sim, sim.Inventory(0, 0, nil), nil
}

// defaultProcessSocket is named after the server, so that daemons sharing a
// host (tests, simulations) do not share a socket.
const defaultProcessSocket = "/run/gpupool/<name>.sock"

// defaultSocketDir is where defaultProcessSocket lies; tests move it.
var defaultSocketDir = "/run/gpupool"

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

// Command is gpupool-server's command line: its options, and Run on them.
func Command() cli.Service {
	o := NewOptions()
	return cli.Service{Name: "gpupool-server", Usage: Usage, Options: o,
		Run: func(ctx context.Context, log *slog.Logger) error { return Run(ctx, o, log) }}
}

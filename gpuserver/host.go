package gpuserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/collector"
	"github.com/gpupool/gpupool/internal/httpserver"
)

// HostConfig is what a GPU host's daemon is assembled from (NewHost).
type HostConfig struct {
	// Config is the daemon's; NewHost builds its Samplers, Fabric, Parent,
	// PodOf and StartTime from the fields below, replacing what is there.
	Config
	// Source is the telemetry, sampled every Interval; every ProcessEvery
	// rounds also read per-process use (the expensive call). A source
	// that follows the daemon (followsDaemon: simulated GPUs) is bound to
	// it: its GPUs follow the daemon's leases and reported processes, on
	// the daemon's clock, and the holders of its device files are found
	// under Proc, in the pods the daemon finds them in.
	Source       collector.Source
	Interval     time.Duration
	ProcessEvery int
	// Proc is the procfs mount the daemon reads processes' parents, pods
	// and start times from, and a source that follows the daemon the
	// holders of its device files; "" reads none.
	Proc string
	// Sysfs is the sysfs mount whose class/infiniband ports are read for
	// the RDMA counters; "" reads none, and so does a host without RDMA
	// ports, which is logged.
	Sysfs string
}

// followsDaemon is a source whose GPUs' use follows the daemon that
// samples it, as fakegpu's simulated GPUs do: NewHost has it follow the
// daemon's leases, the PIDs `gpupool run` reported and the pods of
// processes, on the daemon's clock, with the holders of its device files
// found under proc.
type followsDaemon interface {
	Follow(clock func() time.Time, proc string, leases func() []allocator.Lease,
		pid func(lease string) (int, bool), podOf func(pid int) string)
}

// Host is a GPU host's daemon with everything it runs: the sampler of its
// source, its RDMA ports, its exposition and its HTTP handler.
type Host struct {
	Daemon  *Daemon
	Sampler *collector.Sampler
	// Fabric samples the RDMA ports (a collector.Fabric), every Interval
	// too; nil without them.
	Fabric *collector.Sampler
	// Registry is the daemon's exposition (Registry), which /metrics serves.
	Registry *prometheus.Registry
	// Handler serves /metrics, /healthz and /v1/usage (Handler).
	Handler http.Handler
}

// NewHost assembles a GPU host's daemon on one clock, cfg.Clock (time.Now
// when nil): the snapshots are dated, their staleness judged and a source
// that follows the daemon driven by it alike.
func NewHost(cfg HostConfig) (*Host, error) {
	cfg.setDefaults()
	h := &Host{Sampler: collector.NewSampler(cfg.Source, cfg.Interval, cfg.ProcessEvery, cfg.Clock)}
	if cfg.Sysfs != "" {
		ib := filepath.Join(cfg.Sysfs, "class", "infiniband")
		if _, err := os.Stat(ib); err != nil {
			cfg.Log.Info("no RDMA ports: no InfiniBand/RoCE counters", "path", ib)
		} else {
			ports, err := collector.NewFabric(cfg.Sysfs)
			if err != nil {
				return nil, fmt.Errorf("reading RDMA ports: %w", err)
			}
			h.Fabric = collector.NewSampler(ports, cfg.Interval, 1, cfg.Clock)
		}
	}
	cfg.Samplers, cfg.Fabric = []*collector.Sampler{h.Sampler}, h.Fabric
	cfg.Parent, cfg.PodOf, cfg.StartTime = nil, nil, nil
	if cfg.Proc != "" {
		proc := cfg.Proc
		cfg.Parent, cfg.StartTime = ProcParent(proc), ProcStartTime(proc)
		cfg.PodOf = func(pid int) string { return PodUID(proc, pid) }
	}
	h.Daemon = New(cfg.Config)
	if src, ok := cfg.Source.(followsDaemon); ok {
		src.Follow(cfg.Clock, cfg.Proc, h.Daemon.Leases, h.Daemon.PIDOf, h.Daemon.podOf)
	}
	h.Registry = Registry(h.Daemon)
	h.Handler = Handler(h.Daemon, h.Registry)
	return h, nil
}

// Listeners are where a Host serves; a nil one is not served.
type Listeners struct {
	// HTTP serves Host.Handler.
	HTTP net.Listener
	// Probes answers clients' data-path latency probes.
	Probes net.Listener
	// ProcessSocket takes `gpupool run`'s process reports
	// (ListenProcessSocket, ProcessServer).
	ProcessSocket net.Listener
}

const (
	// probeInterval is the time between the daemon's own probe pings.
	probeInterval = time.Second
	// shutdownTimeout bounds the requests in flight when the host stops.
	shutdownTimeout = 5 * time.Second
)

// Serve runs the host until ctx ends: sampling, the RDMA counters,
// registration and heartbeats, the probes and the HTTP servers. It returns
// once everything stopped, the sampler included, so that the caller may
// close the source; the error is that of a server that failed, which stops
// the host.
func (h *Host) Serve(ctx context.Context, ls Listeners) error {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() { h.Sampler.Run(ctx) })
	if h.Fabric != nil {
		wg.Go(func() { h.Fabric.Run(ctx) })
	}
	wg.Go(func() { h.Daemon.Run(ctx) })
	if ls.Probes != nil {
		wg.Go(func() { h.Daemon.ServeProbes(ctx, ls.Probes, probeInterval) })
	}
	var servers []*http.Server
	var failed error
	var once sync.Once
	serve := func(srv *http.Server, ln net.Listener) {
		servers = append(servers, srv)
		wg.Go(func() {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				once.Do(func() { failed = fmt.Errorf("serving on %s: %w", ln.Addr(), err) })
				stop()
			}
		})
	}
	if ls.HTTP != nil {
		serve(httpserver.New(h.Handler, httpserver.Default), ls.HTTP)
	}
	if ls.ProcessSocket != nil {
		serve(ProcessServer(h.Daemon), ls.ProcessSocket)
	}
	<-ctx.Done()
	shutdown, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	// Shutting down closes the listeners, which removes the process socket.
	for _, srv := range servers {
		_ = srv.Shutdown(shutdown)
	}
	wg.Wait()
	return failed
}

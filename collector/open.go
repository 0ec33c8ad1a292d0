package collector

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpupool/gpupool/inventory"
)

// The GPU sources Open opens, by the name --source gives them.
const (
	SourceSimulated = "simulated"
	SourceNVML      = "nvml"
	SourceDCGM      = "dcgm"
)

// Sources lists them, as an error names what a source may be.
const Sources = SourceSimulated + ", " + SourceNVML + ", " + SourceDCGM

// DefaultDCGMRetry is the time between tries while the dcgm-exporter is
// unreachable or shows no GPU.
const DefaultDCGMRetry = 5 * time.Second

// SourceConfig says which GPU source Open opens, and how.
type SourceConfig struct {
	// Kind is one of Sources.
	Kind string
	// Server is the name the host registers under.
	Server string
	// CPUMilli is the CPU the host offers to leases (0: not accounted).
	CPUMilli int64
	// NVML is the library the nvml source reads; nil loads libnvidia-ml.
	NVML nvml.Interface
	// DCGMURL is the dcgm-exporter's /metrics that the dcgm source reads.
	DCGMURL string
	// DCGMRetry is DefaultDCGMRetry when 0.
	DCGMRetry time.Duration
	// Simulated opens the simulated GPUs and the host as it registers
	// with them: they are a Source of package fakegpu, which imports this
	// one, so the caller opens them.
	Simulated func() (Source, inventory.Server, error)
	// Log says why the nvml source knows no links, and that the dcgm
	// source waits for its exporter.
	Log *slog.Logger
}

// Opened is an open GPU source and the host as it registers.
type Opened struct {
	Source Source
	// Inventory is the host's GPUs, as the source read them when it
	// opened, and its CPU.
	Inventory inventory.Server

	close func()
}

// Close releases the source; call it once nothing samples it any more.
func (o *Opened) Close() {
	if o.close != nil {
		o.close()
	}
}

// Open opens the source cfg.Kind names and reads the host's GPUs from it.
// The dcgm source waits until its exporter shows GPUs (the exporter may
// start after the daemon, as pods of a DaemonSet do), and returns ctx's
// error if ctx ends first.
func Open(ctx context.Context, cfg SourceConfig) (*Opened, error) {
	var o *Opened
	var err error
	switch cfg.Kind {
	case SourceSimulated:
		o, err = openSimulated(cfg)
	case SourceNVML:
		o, err = openNVML(cfg)
	case SourceDCGM:
		o, err = openDCGM(ctx, cfg)
	default:
		return nil, fmt.Errorf("source %q is not one of %s", cfg.Kind, Sources)
	}
	if err != nil {
		return nil, err
	}
	o.Inventory.CPUMilli = cfg.CPUMilli
	return o, nil
}

func openSimulated(cfg SourceConfig) (*Opened, error) {
	if cfg.Simulated == nil {
		return nil, errors.New("the simulated source: no SourceConfig.Simulated opens it")
	}
	src, inv, err := cfg.Simulated()
	if err != nil {
		return nil, err
	}
	return &Opened{Source: src, Inventory: inv}, nil
}

func openNVML(cfg SourceConfig) (*Opened, error) {
	lib := cfg.NVML
	if lib == nil {
		lib = nvml.New()
	}
	nv, err := NewNVML(lib)
	if err != nil {
		return nil, fmt.Errorf("starting the NVML source: %w", err)
	}
	inv, err := nv.Inventory(cfg.Server)
	if err != nil {
		nv.Close()
		return nil, fmt.Errorf("reading the GPUs: %w", err)
	}
	if err := nv.TopologyErr(); err != nil {
		cfg.Log.Warn("the GPUs' links are unknown: the allocator places on this server as if every pair were across sockets", "err", err)
	}
	return &Opened{Source: nv, Inventory: inv, close: nv.Close}, nil
}

func openDCGM(ctx context.Context, cfg SourceConfig) (*Opened, error) {
	dc := &DCGM{URL: cfg.DCGMURL, Client: &http.Client{Timeout: 5 * time.Second}}
	for {
		r, err := dc.Sample(ctx, false)
		if err == nil && len(r.GPUs) > 0 {
			return &Opened{Source: dc, Inventory: Inventory(cfg.Server, r.GPUs)}, nil
		}
		cfg.Log.Warn("waiting for dcgm-exporter", "url", cfg.DCGMURL, "err", err, "gpus", len(r.GPUs))
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(cmp.Or(cfg.DCGMRetry, DefaultDCGMRetry)):
		}
	}
}

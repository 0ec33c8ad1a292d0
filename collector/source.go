// Package collector reads telemetry from its sources (GPUs from NVML or a
// dcgm-exporter, or simulated ones from package fakegpu; RDMA ports from
// sysfs) on loops of their own, and exports the latest snapshot to
// Prometheus. A scrape never
// touches hardware, and one failing GPU or source never fails a scrape:
// each source reports its own success, duration and snapshot age.
package collector

import (
	"context"
	"math"

	"github.com/gpupool/gpupool/inventory"
)

// Source is one place telemetry comes from.
type Source interface {
	// Name labels the source's own metrics (nvml, dcgm, simulated,
	// infiniband).
	Name() string
	// Sample reads every GPU or port, and the processes on the GPUs when
	// processes is true (the per-process call is the expensive one, so the
	// sampler asks for it less often). A GPU that cannot be read is
	// returned with Err set; an error return means the source as a whole
	// failed.
	Sample(ctx context.Context, processes bool) (Reading, error)
}

// Reading is what a source read in one round: GPU sources read GPUs, the
// fabric reads ports.
type Reading struct {
	GPUs  []GPU
	Ports []Port
}

// GPU is what a source saw of one GPU. Readings a source does not offer
// are NaN (floats) and are not exported.
type GPU struct {
	Index int
	UUID  string
	Model string
	// MIG is true when the GPU is partitioned into MIG instances.
	MIG bool
	// Links[j] is how this GPU reaches the GPU at position j of the same
	// reading (itself as LinkNVLink); nil when the source does not know.
	Links []inventory.Link
	// MemoryBytes is the GPU's memory, 0 when the round did not read it;
	// MemoryUsedBytes means something only when MemoryBytes is set.
	MemoryBytes     int64
	MemoryUsedBytes int64
	// Utilization is the share of the last sample period a kernel ran (0..1).
	Utilization        float64
	TemperatureCelsius float64
	PowerWatts         float64
	// Error counters since the driver loaded.
	ECCCorrected, ECCUncorrected uint64
	RetiredPages                 uint64
	XidErrors                    uint64
	// ThrottleReasons is NVML's clocks-event reason bit mask.
	ThrottleReasons uint64
	Healthy         bool
	// Processes is nil when this round did not read them.
	Processes []Process
	// Err says why this GPU could not be read.
	Err error
}

// Process is one process's use of a GPU.
type Process struct {
	PID             int
	MemoryUsedBytes int64
	// SMUtilization is the process's share of the GPU's SM time (0..1),
	// NaN when unknown.
	SMUtilization float64
	// PodUID names the Kubernetes pod the process runs in, when known.
	PodUID string
}

// Inventory is a server as it registers, from what a source saw: a GPU
// that could not be read joins unhealthy (so it takes no leases until it
// recovers), and one whose identity is unknown is left out, and so are the
// other GPUs' links to it. The GPUs carry their links only when every GPU
// of the reading does: the allocator takes a topology whole or not at all.
func Inventory(server string, gpus []GPU) inventory.Server {
	srv := inventory.Server{Name: server}
	var kept []int // the positions in gpus of srv.GPUs
	for i, g := range gpus {
		if g.UUID == "" {
			continue
		}
		kept = append(kept, i)
		srv.GPUs = append(srv.GPUs, inventory.GPU{Index: len(srv.GPUs), UUID: g.UUID, Model: g.Model,
			MemoryBytes: g.MemoryBytes, Healthy: g.Healthy && g.Err == nil})
	}
	if !linksKnown(gpus) {
		return srv
	}
	for k, i := range kept {
		links := make([]inventory.Link, len(kept))
		for m, j := range kept {
			links[m] = gpus[i].Links[j]
		}
		srv.GPUs[k].Links = links
	}
	return srv
}

// linksKnown is whether the source told how each pair of gpus is linked.
func linksKnown(gpus []GPU) bool {
	for _, g := range gpus {
		if len(g.Links) != len(gpus) {
			return false
		}
	}
	return len(gpus) > 0
}

// unknown marks a reading a source does not offer.
var unknown = math.NaN()

// MemoryUsed is the GPU memory in use in bytes, NaN when unknown.
func (g *GPU) MemoryUsed() float64 {
	if g.MemoryBytes <= 0 {
		return unknown
	}
	return float64(g.MemoryUsedBytes)
}

// MemoryPressure is used over total GPU memory (0..1), NaN when unknown.
func (g *GPU) MemoryPressure() float64 {
	return g.MemoryUsed() / float64(g.MemoryBytes)
}

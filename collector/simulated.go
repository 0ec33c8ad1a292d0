package collector

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/gpupool/gpupool/allocator"
)

// Simulated is a host of GPUs whose use follows the leases placed on them:
// each lease runs one process that keeps its share of the GPU busy as its
// Demand says and holds most of the memory it was granted (a few leases,
// chosen by their ID, hold more than granted). Everything follows from the
// seed, the leases and the clock, so tests and the demo are repeatable.
type Simulated struct {
	Server string
	Seed   uint64
	GPUs   []SimulatedGPU
	// Leases returns the leases on this server, nil while they are not
	// known (the daemon has not fetched them yet): the GPUs' use follows
	// from the leases, so until then it is unknown, not idle.
	Leases func() []allocator.Lease
	// Demand is how busy each lease's work keeps its share at t (0..1),
	// by lease ID, given every lease on the server; a lease it leaves out
	// (or all, when nil) follows a slow wave of its own.
	Demand func(leases []allocator.Lease, t time.Time) map[string]float64
	// PID returns the real process a lease's work runs as, when one was
	// reported (by `gpupool run`); other leases get a made-up PID.
	PID   func(lease string) (int, bool)
	Clock func() time.Time
}

// SimulatedGPU is one simulated device.
type SimulatedGPU struct {
	Model       string
	MemoryBytes int64
}

// Name implements Source.
func (*Simulated) Name() string { return "simulated" }

// UUID is the simulated GPU's UUID.
func (s *Simulated) UUID(i int) string { return fmt.Sprintf("GPU-sim-%s-%d", s.Server, i) }

// Inventory is the server as it registers with the allocator.
func (s *Simulated) Inventory(cpuMilli, memoryBytes int64, labels map[string]string) allocator.Server {
	srv := allocator.Server{Name: s.Server, CPUMilli: cpuMilli, MemoryBytes: memoryBytes, Labels: labels}
	for i, g := range s.GPUs {
		srv.GPUs = append(srv.GPUs, allocator.GPU{Index: i, UUID: s.UUID(i), Model: g.Model, MemoryBytes: g.MemoryBytes, Healthy: true})
	}
	return srv
}

// Sample implements Source. While the leases are not known it reports
// the GPUs, healthy, with no readings.
func (s *Simulated) Sample(_ context.Context, processes bool) (Reading, error) {
	now := s.Clock()
	gpus := make([]GPU, len(s.GPUs))
	var leases []allocator.Lease
	if s.Leases != nil {
		if leases = s.Leases(); leases == nil {
			for i, g := range s.GPUs {
				gpus[i] = GPU{Index: i, UUID: s.UUID(i), Model: g.Model, Healthy: true,
					Utilization: unknown, TemperatureCelsius: unknown, PowerWatts: unknown}
			}
			return Reading{GPUs: gpus}, nil
		}
	}
	for i, g := range s.GPUs {
		gpus[i] = GPU{Index: i, UUID: s.UUID(i), Model: g.Model, MemoryBytes: g.MemoryBytes, Healthy: true,
			Utilization: 0.01 * s.noise(uint64(i), now)}
		if processes {
			gpus[i].Processes = []Process{}
		}
	}
	var demands map[string]float64
	if s.Demand != nil {
		demands = s.Demand(leases, now)
	}
	for li := range leases {
		l := &leases[li]
		demand := s.demand(l, demands, now)
		for _, lg := range l.GPUs {
			if lg.Index >= len(gpus) {
				continue
			}
			g := &gpus[lg.Index]
			busy := lg.Share.GPUs() * demand
			used := int64(float64(lg.MemoryBytes) * s.memoryFactor(l))
			g.Utilization += busy
			g.MemoryUsedBytes += used
			if processes {
				g.Processes = append(g.Processes, Process{
					PID: s.pid(l), MemoryUsedBytes: used, SMUtilization: busy, PodUID: l.Owner.UID,
				})
			}
		}
	}
	for i := range gpus {
		g := &gpus[i]
		g.Utilization = math.Min(g.Utilization, 1)
		g.MemoryUsedBytes = min(g.MemoryUsedBytes, g.MemoryBytes)
		g.TemperatureCelsius = 30 + 50*g.Utilization
		g.PowerWatts = 70 + 630*g.Utilization
	}
	return Reading{GPUs: gpus}, nil
}

func (s *Simulated) demand(l *allocator.Lease, demands map[string]float64, t time.Time) float64 {
	if d, ok := demands[l.ID]; ok {
		return math.Max(0, math.Min(1, d))
	}
	phase := float64(s.hash(l.ID)%1000) / 1000 * 2 * math.Pi
	return 0.6 + 0.3*math.Sin(2*math.Pi*float64(t.Unix()%600)/600+phase)
}

// memoryFactor is the share of its granted memory a lease uses: most use
// 50-90%; one in twenty uses 120% (overuse an alert should catch).
func (s *Simulated) memoryFactor(l *allocator.Lease) float64 {
	h := s.hash(l.ID)
	if h%20 == 0 {
		return 1.2
	}
	return 0.5 + float64(h%400)/1000
}

// pid is the process ID of a lease's work.
func (s *Simulated) pid(l *allocator.Lease) int {
	if s.PID != nil {
		if pid, ok := s.PID(l.ID); ok {
			return pid
		}
	}
	return 10000 + int(s.hash(l.ID)%50000)
}

// noise is a seeded value in [0,1) for a GPU and second.
func (s *Simulated) noise(gpu uint64, t time.Time) float64 {
	return float64(s.hash(fmt.Sprint(gpu, "/", t.Unix()))%1000) / 1000
}

func (s *Simulated) hash(key string) uint64 {
	h := fnv.New64a()
	_, _ = fmt.Fprint(h, s.Seed, "/", s.Server, "/", key)
	return h.Sum64()
}

// ParseSimulatedGPUs reads GPUs given as model:memory:count, comma-separated
// (H100:80Gi:8,T4:16Gi:2).
func ParseSimulatedGPUs(s string) ([]SimulatedGPU, error) {
	var out []SimulatedGPU
	for _, part := range strings.Split(s, ",") {
		f := strings.Split(strings.TrimSpace(part), ":")
		if len(f) != 3 {
			return nil, fmt.Errorf("simulated GPUs %q: %q is not model:memory:count", s, part)
		}
		mem, err := allocator.ParseGPUMemory(f[1])
		if err != nil {
			return nil, fmt.Errorf("simulated GPUs %q: %w", s, err)
		}
		n, err := strconv.Atoi(f[2])
		if err != nil || n < 1 || n > 64 {
			return nil, fmt.Errorf("simulated GPUs %q: count %q out of range 1..64", s, f[2])
		}
		for range n {
			out = append(out, SimulatedGPU{Model: f[0], MemoryBytes: mem})
		}
	}
	return out, nil
}

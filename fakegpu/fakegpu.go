// Package fakegpu is a host of GPUs that are not there, for tests, the
// demo and clusters without GPUs: a collector.Source whose GPUs' use
// follows the leases placed on them, optionally held by real processes
// through device files. It is no trace replay (that is package simulate).
package fakegpu

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/collector"
	"github.com/gpupool/gpupool/inventory"
)

// Source is a host of GPUs whose use follows the leases placed on them:
// each lease's work keeps its share of the GPU busy as its Demand says and
// holds most of the memory it was granted (a few leases, chosen by their
// ID, hold more than granted). Everything follows from the seed, the
// leases, the clock and, with DeviceDir, which processes hold the GPUs, so
// tests and the demo are repeatable.
type Source struct {
	Server string
	Seed   uint64
	GPUs   []GPU
	// Topology is how the GPUs link to each other (ParseTopology),
	// a row per GPU; nil when unknown.
	Topology inventory.Topology
	// Leases returns the leases on this server, nil while they are not
	// known (the daemon has not fetched them yet): the GPUs' use follows
	// from the leases, so until then it is unknown, not idle.
	Leases func() []allocator.Lease
	// Demand is how busy each lease's work keeps its share at t (0..1),
	// by lease ID, given every lease on the server; a lease it leaves out
	// (or all, when nil) follows a slow wave of its own.
	Demand func(leases []allocator.Lease, t time.Time) map[string]float64
	// PID returns the real process a lease's work runs as, when one was
	// reported (by `gpupool run`); other leases get a made-up PID. Not
	// used with DeviceDir.
	PID   func(lease string) (int, bool)
	Clock func() time.Time

	// DeviceDir, when set, makes each GPU a file there named by its UUID
	// (CreateDeviceFiles) that real processes hold open, as a CUDA process
	// holds /dev/nvidiaN: the processes on a GPU are those holding its
	// file, found under Proc on the rounds that read processes, and each
	// runs its part of the work of its pod's lease (the lease whose
	// Owner.UID is PodOf's answer) on that GPU. A lease whose pod holds no
	// file is idle, a process of no lease's pod uses nothing, and a GPU
	// whose file is gone is lost. Without DeviceDir each lease runs one
	// made-up process.
	DeviceDir string
	// Proc is the procfs mount the holders are found under.
	Proc string
	// PodOf returns the UID of the pod a process runs in, "" for none.
	PodOf func(pid int) string

	mu sync.Mutex
	// held is, by GPU, the processes the last round that read processes
	// found holding its device file: the rounds between keep them busy.
	held [][]holder
}

// holder is a process holding a device file, and its pod.
type holder struct {
	pid int
	pod string
}

// GPU is one simulated device.
type GPU struct {
	Model       string
	MemoryBytes int64
}

// Name implements collector.Source.
func (*Source) Name() string { return collector.SourceSimulated }

// Follow drives the GPUs by a GPU server's daemon (gpuserver.NewHost calls
// it): by its leases, the PIDs `gpupool run` reported and the pods of
// processes, on its clock, with the holders of the device files found
// under proc.
func (s *Source) Follow(clock func() time.Time, proc string, leases func() []allocator.Lease,
	pid func(lease string) (int, bool), podOf func(pid int) string) {
	s.Clock, s.Proc, s.Leases, s.PID, s.PodOf = clock, proc, leases, pid, podOf
}

// unknown marks a reading the GPUs do not have.
var unknown = math.NaN()

// UUID is the simulated GPU's UUID.
func (s *Source) UUID(i int) string { return fmt.Sprintf("GPU-sim-%s-%d", s.Server, i) }

// Inventory is the server as it registers with the allocator.
func (s *Source) Inventory(cpuMilli, memoryBytes int64, labels map[string]string) inventory.Server {
	srv := inventory.Server{Name: s.Server, CPUMilli: cpuMilli, MemoryBytes: memoryBytes, Labels: labels}
	for i, g := range s.GPUs {
		srv.GPUs = append(srv.GPUs, inventory.GPU{Index: i, UUID: s.UUID(i), Model: g.Model, MemoryBytes: g.MemoryBytes, Healthy: true})
	}
	if s.Topology != nil {
		srv.SetTopology(s.Topology)
	}
	return srv
}

// Sample implements collector.Source. While the leases are not known it
// reports the GPUs, healthy, with no readings.
func (s *Source) Sample(_ context.Context, processes bool) (collector.Reading, error) {
	var files map[fileID]int
	var lost map[int]error
	if s.DeviceDir != "" {
		files, lost = s.deviceFiles()
	}
	r, err := s.sample(processes, files)
	if err != nil {
		return collector.Reading{}, err
	}
	for i, why := range lost {
		r.GPUs[i] = collector.GPU{Index: i, UUID: s.UUID(i), Model: s.GPUs[i].Model, Err: why,
			Utilization: unknown, TemperatureCelsius: unknown, PowerWatts: unknown}
	}
	if s.Topology != nil {
		for i := range r.GPUs {
			r.GPUs[i].Links = s.Topology[i]
		}
	}
	return r, nil
}

// sample reads the GPUs, and their processes when processes is true;
// files are the device files by identity (with DeviceDir).
func (s *Source) sample(processes bool, files map[fileID]int) (collector.Reading, error) {
	now := s.Clock()
	gpus := make([]collector.GPU, len(s.GPUs))
	var leases []allocator.Lease
	if s.Leases != nil {
		if leases = s.Leases(); leases == nil {
			for i, g := range s.GPUs {
				gpus[i] = collector.GPU{Index: i, UUID: s.UUID(i), Model: g.Model, Healthy: true,
					Utilization: unknown, TemperatureCelsius: unknown, PowerWatts: unknown}
			}
			return collector.Reading{GPUs: gpus}, nil
		}
	}
	for i, g := range s.GPUs {
		gpus[i] = collector.GPU{Index: i, UUID: s.UUID(i), Model: g.Model, MemoryBytes: g.MemoryBytes, Healthy: true,
			Utilization: 0.01 * s.noise(uint64(i), now)}
		if processes {
			gpus[i].Processes = []collector.Process{}
		}
	}
	procs, err := s.processes(leases, files, processes)
	if err != nil {
		return collector.Reading{}, err
	}
	var demands map[string]float64
	if s.Demand != nil {
		demands = s.Demand(leases, now)
	}
	for _, p := range procs {
		var busy float64
		var used int64
		if l := p.lease; l != nil {
			busy = p.grant.Share.GPUs() * s.demand(l, demands, now) * p.part
			used = int64(float64(p.grant.MemoryBytes) * s.memoryFactor(l) * p.part)
		}
		g := &gpus[p.gpu]
		g.Utilization += busy
		g.MemoryUsedBytes += used
		if processes {
			g.Processes = append(g.Processes, collector.Process{PID: p.pid, MemoryUsedBytes: used, SMUtilization: busy, PodUID: p.pod})
		}
	}
	for i := range gpus {
		g := &gpus[i]
		g.Utilization = math.Min(g.Utilization, 1)
		g.MemoryUsedBytes = min(g.MemoryUsedBytes, g.MemoryBytes)
		g.TemperatureCelsius = 30 + 50*g.Utilization
		g.PowerWatts = 70 + 630*g.Utilization
	}
	return collector.Reading{GPUs: gpus}, nil
}

// simProcess is a process on a simulated GPU: the lease whose work it
// runs (nil for none), the lease's grant on the GPU and the part of its
// work there that the process runs.
type simProcess struct {
	gpu, pid int
	// pod is the pod UID the process reports, "" for the daemon to find.
	pod   string
	lease *allocator.Lease
	grant allocator.LeaseGPU
	part  float64
}

// processes lists the processes on the GPUs: without DeviceDir one made up
// per lease and GPU, under the lease's pod (its PID only when scan is
// true: only then are processes reported); with it the processes holding
// files, found anew when scan is true, else as the last scan found them.
func (s *Source) processes(leases []allocator.Lease, files map[fileID]int, scan bool) ([]simProcess, error) {
	var out []simProcess
	if s.DeviceDir == "" {
		for li := range leases {
			l := &leases[li]
			for _, lg := range l.GPUs {
				if lg.Index >= len(s.GPUs) {
					continue
				}
				p := simProcess{gpu: lg.Index, pod: l.Owner.UID, lease: l, grant: lg, part: 1}
				if scan {
					p.pid = s.pid(l)
				}
				out = append(out, p)
			}
		}
		return out, nil
	}
	held, err := s.holders(files, scan)
	if err != nil {
		return nil, err
	}
	ofPod := map[string]*allocator.Lease{}
	for li := range leases {
		if uid := leases[li].Owner.UID; uid != "" {
			ofPod[uid] = &leases[li]
		}
	}
	for gpu, hs := range held {
		first := len(out)
		processesOf := map[*allocator.Lease]int{} // the lease's processes on this GPU
		for _, h := range hs {
			p := simProcess{gpu: gpu, pid: h.pid}
			if l := ofPod[h.pod]; l != nil {
				if i := slices.IndexFunc(l.GPUs, func(g allocator.LeaseGPU) bool { return g.Index == gpu }); i >= 0 {
					p.lease, p.grant = l, l.GPUs[i]
					processesOf[l]++
				}
			}
			out = append(out, p)
		}
		for i := first; i < len(out); i++ {
			if l := out[i].lease; l != nil {
				out[i].part = 1 / float64(processesOf[l])
			}
		}
	}
	return out, nil
}

// holders is, by GPU, the processes holding its device file: found under
// Proc when scan is true, else those the last scan found.
func (s *Source) holders(files map[fileID]int, scan bool) ([][]holder, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !scan {
		return s.held, nil
	}
	pids, err := holdersOf(s.Proc, files)
	if err != nil {
		return nil, fmt.Errorf("finding the processes that hold the simulated GPUs: %w", err)
	}
	s.held = make([][]holder, len(s.GPUs))
	for gpu, ps := range pids {
		for _, pid := range ps {
			h := holder{pid: pid}
			if s.PodOf != nil {
				h.pod = s.PodOf(pid)
			}
			s.held[gpu] = append(s.held[gpu], h)
		}
	}
	return s.held, nil
}

func (s *Source) demand(l *allocator.Lease, demands map[string]float64, t time.Time) float64 {
	if d, ok := demands[l.ID]; ok {
		return math.Max(0, math.Min(1, d))
	}
	phase := float64(s.hash(l.ID)%1000) / 1000 * 2 * math.Pi
	return 0.6 + 0.3*math.Sin(2*math.Pi*float64(t.Unix()%600)/600+phase)
}

// memoryFactor is the share of its granted memory a lease uses: most use
// 50-90%; one in twenty uses 120% (overuse an alert should catch).
func (s *Source) memoryFactor(l *allocator.Lease) float64 {
	h := s.hash(l.ID)
	if h%20 == 0 {
		return 1.2
	}
	return 0.5 + float64(h%400)/1000
}

// pid is the process ID of a lease's work.
func (s *Source) pid(l *allocator.Lease) int {
	if s.PID != nil {
		if pid, ok := s.PID(l.ID); ok {
			return pid
		}
	}
	return 10000 + int(s.hash(l.ID)%50000)
}

// noise is a seeded value in [0,1) for a GPU and second.
func (s *Source) noise(gpu uint64, t time.Time) float64 {
	return float64(s.hash(fmt.Sprint(gpu, "/", t.Unix()))%1000) / 1000
}

func (s *Source) hash(key string) uint64 {
	h := fnv.New64a()
	_, _ = fmt.Fprint(h, s.Seed, "/", s.Server, "/", key)
	return h.Sum64()
}

// ParseGPUs reads GPUs given as model:memory:count, comma-separated
// (H100:80Gi:8,T4:16Gi:2).
func ParseGPUs(s string) ([]GPU, error) {
	var out []GPU
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
			out = append(out, GPU{Model: f[0], MemoryBytes: mem})
		}
	}
	return out, nil
}

// Topologies are the shapes ParseTopology knows.
const Topologies = "nvswitch, pcie, none"

// ParseTopology is the topology named for n simulated GPUs:
// nvswitch (every pair NVLink, as on an HGX board), pcie (no NVLink, two
// GPUs behind each PCIe switch and two switches per CPU socket, in GPU
// order: GPUs 0-3 on the first socket, 4-7 on the next, and so on), or
// none (unknown, nil).
func ParseTopology(name string, n int) (inventory.Topology, error) {
	switch name {
	case "nvswitch":
		return inventory.NVSwitchTopology(n), nil
	case "pcie":
		return inventory.PCIeTopology(n, 2, 2), nil
	case "none":
		return nil, nil
	}
	return nil, fmt.Errorf("simulated topology %q is not one of %s", name, Topologies)
}

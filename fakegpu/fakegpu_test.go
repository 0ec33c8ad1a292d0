package fakegpu

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/collector"
	"github.com/gpupool/gpupool/inventory"
)

// readings are the per-GPU series that carry a measurement.
var readings = []string{"bitfusion_gpu_utilization", "bitfusion_memory_pressure", "bitfusion_gpu_memory_used_bytes",
	"bitfusion_gpu_temperature_celsius", "bitfusion_gpu_power_watts"}

func TestFollowsLeases(t *testing.T) {
	now := time.Unix(1.8e9, 0)
	lease := allocator.Lease{ID: "lease-000007", Owner: allocator.Owner{UID: "uid-1"},
		GPUs: []allocator.LeaseGPU{{Index: 1, Share: 500, MemoryBytes: 40 << 30}}}
	sim := &Source{Server: "sim", Seed: 3, Clock: func() time.Time { return now },
		GPUs:   []GPU{{Model: "H100", MemoryBytes: 80 << 30}, {Model: "H100", MemoryBytes: 80 << 30}},
		Leases: func() []allocator.Lease { return []allocator.Lease{lease} },
		Demand: func(ls []allocator.Lease, _ time.Time) map[string]float64 {
			out := map[string]float64{}
			for _, l := range ls {
				out[l.ID] = 0.8
			}
			return out
		},
	}
	r, err := sim.Sample(context.Background(), true)
	if err != nil {
		t.Fatal(err)
	}
	gpus := r.GPUs
	g := gpus[1]
	if math.Abs(g.Utilization-(0.4+0.01*sim.noise(1, now))) > 1e-9 || len(g.Processes) != 1 {
		t.Fatalf("GPU 1 = %+v, want 0.5 share x 0.8 demand busy and one process", g)
	}
	p := g.Processes[0]
	if p.SMUtilization != 0.4 || p.PodUID != "uid-1" || p.MemoryUsedBytes != int64(float64(40<<30)*sim.memoryFactor(&lease)) {
		t.Errorf("process = %+v", p)
	}
	if gpus[0].Processes == nil || len(gpus[0].Processes) != 0 || gpus[0].Utilization >= 0.01 {
		t.Errorf("idle GPU 0 = %+v", gpus[0])
	}
	again, _ := sim.Sample(context.Background(), true)
	if again.GPUs[1].Utilization != g.Utilization {
		t.Error("the same seed, leases and time gave a different reading")
	}
}

// TestBeforeLeasesAreKnown: simulated GPUs follow their leases,
// so before the daemon has fetched them (Leases returns nil) the GPUs are
// there and healthy but nothing about their use is known: no reading is
// exported, and no process list (not an empty one) is given.
func TestBeforeLeasesAreKnown(t *testing.T) {
	now := time.Unix(1.8e9, 0)
	var leases []allocator.Lease // not fetched yet
	sim := &Source{Server: "sim", Seed: 3, Clock: func() time.Time { return now },
		GPUs:   []GPU{{Model: "H100", MemoryBytes: 80 << 30}},
		Leases: func() []allocator.Lease { return leases }}
	s := collector.NewSampler(sim, time.Second, 5, sim.Clock)
	c := &collector.GPUCollector{Server: "gpu-a", Samplers: []*collector.Sampler{s}, Clock: sim.Clock}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)

	s.Round(context.Background())
	c.Render(s)
	g := s.Latest().GPUs[0]
	if !g.Healthy || g.Err != nil || g.UUID == "" || g.Processes != nil || !math.IsNaN(g.Utilization) {
		t.Errorf("GPU before the leases are known = %+v, want healthy, identified, no reading, no process list", g)
	}
	for _, name := range readings {
		if n := testutil.CollectAndCount(reg, name); n != 0 {
			t.Errorf("%s exported before the leases are known: %d series", name, n)
		}
	}
	if n := testutil.CollectAndCount(reg, "bitfusion_gpu_device_info"); n != 1 {
		t.Errorf("bitfusion_gpu_device_info: %d series, want the GPU", n)
	}

	leases = []allocator.Lease{} // fetched: none
	s.Round(context.Background())
	c.Render(s)
	if got := s.Latest(); got.ProcessRound != 2 || got.GPUs[0].Processes == nil {
		t.Errorf("round 2 read processes in round %d (%+v); want the round after the first list-less one to ask again", got.ProcessRound, got.GPUs[0].Processes)
	}
	for _, name := range readings {
		if n := testutil.CollectAndCount(reg, name); n != 1 {
			t.Errorf("%s once the leases are known: %d series, want 1", name, n)
		}
	}
}

// TestTopologies: each --simulate-topology shape links the
// simulated GPUs as it says, in the inventory and in every reading, and
// the source says whether it knows the links.
func TestTopologies(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pairs map[[2]int]inventory.Link
		known string
	}{
		{"nvswitch", map[[2]int]inventory.Link{{0, 1}: inventory.LinkNVLink, {0, 7}: inventory.LinkNVLink, {3, 4}: inventory.LinkNVLink}, "1"},
		{"pcie", map[[2]int]inventory.Link{{0, 1}: inventory.LinkPCIeSwitch, {6, 7}: inventory.LinkPCIeSwitch, {1, 2}: inventory.LinkSocket,
			{4, 7}: inventory.LinkSocket, {3, 4}: inventory.LinkAny, {0, 7}: inventory.LinkAny}, "1"},
		{"none", nil, "0"},
	} {
		topo, err := ParseTopology(tc.name, 8)
		if err != nil {
			t.Fatal(err)
		}
		sim := &Source{Server: "sim", GPUs: slices.Repeat([]GPU{{Model: "H100", MemoryBytes: 80 << 30}}, 8),
			Clock: func() time.Time { return time.Unix(1.8e9, 0) }, Topology: topo}
		inv := sim.Inventory(0, 0, nil)
		s := collector.NewSampler(sim, time.Second, 1, sim.Clock)
		s.Round(context.Background())
		for i := range 8 {
			inInventory, inReading := inv.GPUs[i].Links, s.Latest().GPUs[i].Links
			if (inInventory == nil) != (topo == nil) || !slices.Equal(inInventory, inReading) {
				t.Errorf("%s: GPU %d links %v in the inventory, %v in the reading", tc.name, i, inInventory, inReading)
			}
		}
		for p, want := range tc.pairs {
			if got := inv.GPUs[p[0]].Links[p[1]]; got != want || inv.GPUs[p[1]].Links[p[0]] != want {
				t.Errorf("%s: GPUs %d and %d are %s, want %s both ways", tc.name, p[0], p[1], got, want)
			}
		}
		reg := prometheus.NewRegistry()
		reg.MustRegister(&collector.GPUCollector{Server: "sim", Samplers: []*collector.Sampler{s}, Clock: sim.Clock})
		want := `
# HELP bitfusion_exporter_gpu_links_known 1 when the source knows how each pair of its GPUs is linked (NVLink, PCIe switch, CPU socket).
# TYPE bitfusion_exporter_gpu_links_known gauge
bitfusion_exporter_gpu_links_known{source="simulated"} ` + tc.known + "\n"
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "bitfusion_exporter_gpu_links_known"); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	if _, err := ParseTopology("nvlink", 8); err == nil || err.Error() != `simulated topology "nvlink" is not one of nvswitch, pcie, none` {
		t.Errorf("ParseTopology(nvlink) = %v", err)
	}
}

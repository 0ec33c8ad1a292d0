package collector

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpupool/gpupool/allocator"
)

func TestSimulatedFollowsLeases(t *testing.T) {
	now := time.Unix(1.8e9, 0)
	lease := allocator.Lease{ID: "lease-000007", Owner: allocator.Owner{UID: "uid-1"},
		GPUs: []allocator.LeaseGPU{{Index: 1, Share: 500, MemoryBytes: 40 << 30}}}
	sim := &Simulated{Server: "sim", Seed: 3, Clock: func() time.Time { return now },
		GPUs:   []SimulatedGPU{{Model: "H100", MemoryBytes: 80 << 30}, {Model: "H100", MemoryBytes: 80 << 30}},
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

// flakySource fails when told to.
type flakySource struct {
	fail bool
	gpus []GPU
}

func (f *flakySource) Name() string { return "flaky" }
func (f *flakySource) Sample(context.Context, bool) (Reading, error) {
	if f.fail {
		return Reading{}, errors.New("driver went away")
	}
	return Reading{GPUs: f.gpus}, nil
}

// TestSourceFailureKeepsTheScrapeAlive: a failing source reports success 0
// and the age of its last good snapshot, whose GPUs stay exported.
func TestSourceFailureKeepsTheScrapeAlive(t *testing.T) {
	now := time.Unix(1.8e9, 0)
	src := &flakySource{gpus: []GPU{{Index: 0, UUID: "GPU-0", Model: "H100", MemoryBytes: 100, MemoryUsedBytes: 95,
		Utilization: 0.5, TemperatureCelsius: unknown, PowerWatts: unknown, Healthy: true}}}
	s := NewSampler(src, time.Second, 1, func() time.Time { return now })
	s.Round(context.Background())
	src.fail = true
	now = now.Add(7 * time.Second)
	s.Round(context.Background())

	reg := prometheus.NewRegistry()
	reg.MustRegister(&GPUCollector{Server: "gpu-a", Samplers: []*Sampler{s}, Clock: func() time.Time { return now }})
	want := `
# HELP bitfusion_exporter_snapshot_age_seconds Age of the newest good snapshot of the source at scrape time.
# TYPE bitfusion_exporter_snapshot_age_seconds gauge
bitfusion_exporter_snapshot_age_seconds{source="flaky"} 7
# HELP bitfusion_exporter_source_success 1 when the source's last sampling round succeeded.
# TYPE bitfusion_exporter_source_success gauge
bitfusion_exporter_source_success{source="flaky"} 0
# HELP bitfusion_gpu_utilization Share of the last sample period a kernel ran on the GPU (0..1).
# TYPE bitfusion_gpu_utilization gauge
bitfusion_gpu_utilization{gpu="0",model="H100",server="gpu-a"} 0.5
# HELP bitfusion_memory_pressure GPU memory used over total (0..1).
# TYPE bitfusion_memory_pressure gauge
bitfusion_memory_pressure{gpu="0",model="H100",server="gpu-a"} 0.95
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "bitfusion_exporter_snapshot_age_seconds",
		"bitfusion_exporter_source_success", "bitfusion_gpu_utilization", "bitfusion_memory_pressure"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(reg, "bitfusion_gpu_temperature_celsius"); n != 0 {
		t.Errorf("unknown temperature exported as %d series", n)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

func TestSamplerReadsProcessesLessOften(t *testing.T) {
	calls := 0
	src := sourceFunc(func(processes bool) []GPU {
		calls++
		g := GPU{UUID: "GPU-0"}
		if processes {
			g.Processes = []Process{{PID: calls}}
		}
		return []GPU{g}
	})
	s := NewSampler(src, time.Second, 3, nil)
	for range 4 {
		s.Round(context.Background())
	}
	// Rounds 1 and 4 read processes; round 4's are current, rounds 2-3 carried round 1's.
	if got := s.Latest().GPUs[0].Processes; len(got) != 1 || got[0].PID != 4 {
		t.Errorf("processes after 4 rounds = %+v, want those read in round 4", got)
	}
}

type sourceFunc func(processes bool) []GPU

func (f sourceFunc) Name() string { return "func" }
func (f sourceFunc) Sample(_ context.Context, processes bool) (Reading, error) {
	return Reading{GPUs: f(processes)}, nil
}

func TestDCGMExporterMapping(t *testing.T) {
	fixture, err := os.ReadFile("testdata/dcgm-exporter.txt")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(fixture) }))
	defer srv.Close()
	src := &DCGM{URL: srv.URL}
	r, err := src.Sample(context.Background(), true)
	gpus := r.GPUs
	if err != nil || len(gpus) != 2 {
		t.Fatalf("Sample = %d GPUs, %v", len(gpus), err)
	}
	g := gpus[1]
	checks := []struct {
		name      string
		got, want float64
	}{
		{"utilization", g.Utilization, 0.97},
		{"memory used bytes", float64(g.MemoryUsedBytes), 72800 * mib},
		{"memory bytes", float64(g.MemoryBytes), (72800 + 8759) * mib},
		{"temperature", g.TemperatureCelsius, 58},
		{"power", g.PowerWatts, 541.223},
		{"ecc corrected", float64(g.ECCCorrected), 12},
		{"ecc uncorrected", float64(g.ECCUncorrected), 2},
		{"xid errors", float64(g.XidErrors), 1},
		{"throttle reasons", float64(g.ThrottleReasons), 36},
	}
	for _, c := range checks {
		if math.Abs(c.got-c.want) > 1e-9 {
			t.Errorf("GPU 1 %s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if g.UUID != "GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0" || g.Model != "NVIDIA H100 80GB HBM3" || g.Healthy {
		t.Errorf("GPU 1 identity/health = %s %s %v (double-bit ECC errors make it unhealthy)", g.UUID, g.Model, g.Healthy)
	}
	if gpus[0].Utilization != 0 || !gpus[0].Healthy {
		t.Errorf("GPU 0 = %+v", gpus[0])
	}
	// The same Xid code seen again is the same error, not a new one.
	again, _ := src.Sample(context.Background(), false)
	if again.GPUs[1].XidErrors != 1 {
		t.Errorf("Xid errors after a second scrape = %d, want still 1", again.GPUs[1].XidErrors)
	}
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }))
	defer down.Close()
	if _, err := (&DCGM{URL: down.URL}).Sample(context.Background(), false); err == nil {
		t.Error("a failing dcgm-exporter is not an error")
	}
}

// TestFabricFromSysfs reads the fixture tree as node_exporter's tests do,
// on the sampler the GPUs use: before its first round the ports have no
// series, nor the round a duration.
func TestFabricFromSysfs(t *testing.T) {
	now := time.Unix(1.8e9, 0)
	f, err := NewFabric("testdata/sys")
	if err != nil {
		t.Fatal(err)
	}
	s := NewSampler(f, time.Second, 1, func() time.Time { return now })
	c := &GPUCollector{Server: "gpu-a", Samplers: []*Sampler{s}, Clock: func() time.Time { return now }}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	for name, n := range countSeries(t, reg, "bitfusion_rdma_port_info", "bitfusion_exporter_source_duration_seconds") {
		if n != 0 {
			t.Errorf("%s before the first round: %d series", name, n)
		}
	}
	s.Round(context.Background())
	c.Render(s)
	want := `
# HELP bitfusion_rdma_port_info RDMA ports of the host; 1 per port, with its link layer (InfiniBand or Ethernet for RoCE).
# TYPE bitfusion_rdma_port_info gauge
bitfusion_rdma_port_info{device="mlx5_0",link_layer="InfiniBand",port="1",server="gpu-a"} 1
bitfusion_rdma_port_info{device="mlx5_1",link_layer="Ethernet",port="1",server="gpu-a"} 1
# HELP bitfusion_rdma_port_rate_bytes_per_second Negotiated port rate.
# TYPE bitfusion_rdma_port_rate_bytes_per_second gauge
bitfusion_rdma_port_rate_bytes_per_second{device="mlx5_0",port="1",server="gpu-a"} 5e+10
bitfusion_rdma_port_rate_bytes_per_second{device="mlx5_1",port="1",server="gpu-a"} 1.25e+10
# HELP bitfusion_rdma_port_received_bytes_total Data received on the port.
# TYPE bitfusion_rdma_port_received_bytes_total counter
bitfusion_rdma_port_received_bytes_total{device="mlx5_0",port="1",server="gpu-a"} 4e+06
bitfusion_rdma_port_received_bytes_total{device="mlx5_1",port="1",server="gpu-a"} 0
# HELP bitfusion_rdma_port_up 1 while the port's state is ACTIVE.
# TYPE bitfusion_rdma_port_up gauge
bitfusion_rdma_port_up{device="mlx5_0",port="1",server="gpu-a"} 1
bitfusion_rdma_port_up{device="mlx5_1",port="1",server="gpu-a"} 0
# HELP bitfusion_exporter_source_success 1 when the source's last sampling round succeeded.
# TYPE bitfusion_exporter_source_success gauge
bitfusion_exporter_source_success{source="infiniband"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "bitfusion_rdma_port_info", "bitfusion_rdma_port_rate_bytes_per_second",
		"bitfusion_rdma_port_received_bytes_total", "bitfusion_rdma_port_up", "bitfusion_exporter_source_success"); err != nil {
		t.Error(err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// TestSimulatedTopologies: each --simulate-topology shape links the
// simulated GPUs as it says, in the inventory and in every reading, and
// the source says whether it knows the links.
func TestSimulatedTopologies(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pairs map[[2]int]allocator.Link
		known string
	}{
		{"nvswitch", map[[2]int]allocator.Link{{0, 1}: allocator.LinkNVLink, {0, 7}: allocator.LinkNVLink, {3, 4}: allocator.LinkNVLink}, "1"},
		{"pcie", map[[2]int]allocator.Link{{0, 1}: allocator.LinkPCIeSwitch, {6, 7}: allocator.LinkPCIeSwitch, {1, 2}: allocator.LinkSocket,
			{4, 7}: allocator.LinkSocket, {3, 4}: allocator.LinkAny, {0, 7}: allocator.LinkAny}, "1"},
		{"none", nil, "0"},
	} {
		topo, err := ParseSimulatedTopology(tc.name, 8)
		if err != nil {
			t.Fatal(err)
		}
		sim := &Simulated{Server: "sim", GPUs: slices.Repeat([]SimulatedGPU{{Model: "H100", MemoryBytes: 80 << 30}}, 8),
			Clock: func() time.Time { return time.Unix(1.8e9, 0) }, Topology: topo}
		inv := sim.Inventory(0, 0, nil)
		s := NewSampler(sim, time.Second, 1, sim.Clock)
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
		reg.MustRegister(&GPUCollector{Server: "sim", Samplers: []*Sampler{s}, Clock: sim.Clock})
		want := `
# HELP bitfusion_exporter_gpu_links_known 1 when the source knows how each pair of its GPUs is linked (NVLink, PCIe switch, CPU socket).
# TYPE bitfusion_exporter_gpu_links_known gauge
bitfusion_exporter_gpu_links_known{source="simulated"} ` + tc.known + "\n"
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "bitfusion_exporter_gpu_links_known"); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	if _, err := ParseSimulatedTopology("nvlink", 8); err == nil || err.Error() != `simulated topology "nvlink" is not one of nvswitch, pcie, none` {
		t.Errorf("ParseSimulatedTopology(nvlink) = %v", err)
	}
}

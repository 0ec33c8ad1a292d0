package collector

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

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

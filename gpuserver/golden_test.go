package gpuserver

import (
	"bytes"
	"context"
	"flag"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/collector"
	gpuapi "github.com/gpupool/gpupool/gpuserver/api"
	"github.com/gpupool/gpupool/internal/metricstest"
)

var update = flag.Bool("update", false, "rewrite testdata/metrics.golden (read the diff!)")

// goldenDaemon is a daemon on two simulated GPUs with two leases, at a
// fixed time, as the gpupool-server binary builds it.
func goldenDaemon(t testing.TB) *Daemon {
	now := time.Unix(1.8e9, 0)
	var d *Daemon
	sim := &collector.Simulated{Server: "gpu-a", Seed: 7, Clock: func() time.Time { return now },
		GPUs:   []collector.SimulatedGPU{{Model: "H100", MemoryBytes: 80 << 30}, {Model: "H100", MemoryBytes: 80 << 30}},
		Leases: func() []allocator.Lease { return d.Leases() },
	}
	sampler := collector.NewSampler(sim, time.Second, 1, sim.Clock)
	fabric, err := collector.NewFabric("../collector/testdata/sys", sim.Clock)
	if err != nil {
		t.Fatal(err)
	}
	fabric.Round()
	d = New(Config{Inventory: sim.Inventory(0, 0, nil), Samplers: []*collector.Sampler{sampler}, Fabric: fabric,
		LabelAllowlist: []string{"app"}, Clock: sim.Clock})
	d.leases = []allocator.Lease{
		{ID: "lease-000001", Namespace: "ml", Server: "gpu-a", Owner: allocator.Owner{Pod: "tf-training-0", UID: "uid-0", Labels: map[string]string{"app": "tf-training"}},
			GPUs: []allocator.LeaseGPU{{Index: 0, Milli: 500, MemoryBytes: 40 << 30}}},
		{ID: "lease-000002", Namespace: "team-b", Server: "gpu-a", Owner: allocator.Owner{Pod: "job-1", UID: "uid-1"},
			GPUs: []allocator.LeaseGPU{{Index: 0, Milli: 250, MemoryBytes: 20 << 30}, {Index: 1, Milli: 250, MemoryBytes: 20 << 30}}},
	}
	sampler.Round(context.Background())
	d.latency.WithLabelValues("gpu-a", "client-node-1", gpuapi.TransportTCP).Observe(42e-6)
	return d
}

// TestDaemonMetricsGolden compares the daemon's whole exposition with
// testdata/metrics.golden (durations, which vary, aside) and checks it
// with promtool.
func TestDaemonMetricsGolden(t *testing.T) {
	reg := Registry(goldenDaemon(t))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	for _, f := range families {
		if f.GetName() != "bitfusion_exporter_source_duration_seconds" {
			_, _ = expfmt.MetricFamilyToText(&out, f)
		}
	}
	if *update {
		if err := os.WriteFile("testdata/metrics.golden", out.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("testdata/metrics.golden")
	if err != nil {
		t.Fatalf("%v (go test ./gpuserver -run Golden -update)", err)
	}
	if !bytes.Equal(want, out.Bytes()) {
		t.Errorf("exposition differs from testdata/metrics.golden (rewrite with -update and read the diff):\n%s", out.String())
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
	if ok, err := metricstest.Promtool(families); err != nil {
		t.Error(err)
	} else if !ok {
		t.Skip("promtool not installed (make deps installs it)")
	}
}

// TestDaemonMetricsDocumented checks docs/metrics.md's GPU-server section
// against what the daemon exports, both ways.
func TestDaemonMetricsDocumented(t *testing.T) {
	documented, err := metricstest.Section("../docs/metrics.md", "GPU server")
	if err != nil {
		t.Fatal(err)
	}
	families, err := Registry(goldenDaemon(t)).Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range metricstest.Diff(families, documented) {
		t.Error(p)
	}
}

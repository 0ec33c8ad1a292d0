package gpuserver

import (
	"context"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/fakegpu"
	gpuapi "github.com/gpupool/gpupool/gpuserver/api"
	"github.com/gpupool/gpupool/internal/metricstest"
	"github.com/gpupool/gpupool/inventory"
)

// goldenHost is a daemon on two simulated GPUs with two leases, at a
// fixed time, as the gpupool-server binary builds it (the GPUs on one
// NVSwitch fabric, its default --simulate-topology).
func goldenHost(t testing.TB) *Host {
	now := time.Unix(1.8e9, 0)
	sim := &fakegpu.Source{Server: "gpu-a", Seed: 7,
		GPUs:     []fakegpu.GPU{{Model: "H100", MemoryBytes: 80 << 30}, {Model: "H100", MemoryBytes: 80 << 30}},
		Topology: inventory.NVSwitchTopology(2),
	}
	h, err := NewHost(HostConfig{
		Config: Config{Inventory: sim.Inventory(0, 0, nil), LabelAllowlist: []string{"app"}, Clock: func() time.Time { return now }},
		Source: sim, Interval: time.Second, ProcessEvery: 1, Sysfs: "../collector/testdata/sys",
	})
	if err != nil {
		t.Fatal(err)
	}
	h.Fabric.Round(context.Background())
	d := h.Daemon
	d.leases = []allocator.Lease{
		{ID: "lease-000001", Namespace: "ml", Server: "gpu-a", Owner: allocator.Owner{Pod: "tf-training-0", UID: "uid-0", Labels: map[string]string{"app": "tf-training"}},
			GPUs: []allocator.LeaseGPU{{Index: 0, Share: 500, MemoryBytes: 40 << 30}}},
		{ID: "lease-000002", Namespace: "team-b", Server: "gpu-a", Owner: allocator.Owner{Pod: "job-1", UID: "uid-1"},
			GPUs: []allocator.LeaseGPU{{Index: 0, Share: 250, MemoryBytes: 20 << 30}, {Index: 1, Share: 250, MemoryBytes: 20 << 30}}},
	}
	h.Sampler.Round(context.Background())
	d.latency.WithLabelValues("gpu-a", "client-node-1", gpuapi.TransportTCP).Observe(42e-6)
	return h
}

// TestDaemonMetricsGolden compares the daemon's whole exposition with
// testdata/metrics.golden (durations, which vary, aside) and checks it
// with promtool.
func TestDaemonMetricsGolden(t *testing.T) {
	metricstest.Golden(t, goldenHost(t).Registry, "testdata/metrics.golden", "bitfusion_exporter_source_duration_seconds")
}

// TestDaemonMetricsDocumented checks docs/metrics.md's GPU-server section
// against the daemon's metric table, and the table against what the
// daemon exports.
func TestDaemonMetricsDocumented(t *testing.T) {
	metricstest.Documented(t, "../docs/metrics.md", "GPU server", MetricFamilies, goldenHost(t).Registry)
}

package gpuserver

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/collector"
	"github.com/gpupool/gpupool/inventory"
)

func TestPodUIDFromCgroup(t *testing.T) {
	for pid, want := range map[int]string{
		4242: "6f1d1c8e-2b4a-4f7e-9a35-0c1d2e3f4a5b", // systemd driver: pod<uid with _>.slice
		5000: "0d3c8c51-4f6e-4a4b-8d9e-1c2b3a4f5e6d", // cgroupfs driver, cgroup v1
		5001: "",                                     // not in a pod
		9999: "",                                     // gone
	} {
		if got := PodUID("testdata/proc", pid); got != want {
			t.Errorf("PodUID(%d) = %q, want %q", pid, got, want)
		}
	}
}

func TestProcParentHandlesOddNames(t *testing.T) {
	parent := ProcParent("testdata/proc")
	if p, ok := parent(5001); !ok || p != 5000 {
		t.Errorf("parent of 5001 (named \"worker (1)\") = %d, %v; want 5000", p, ok)
	}
	if _, ok := parent(9999); ok {
		t.Error("a gone process has a parent")
	}
}

// fixedSource returns the same GPUs every round.
type fixedSource struct{ gpus []collector.GPU }

func (f *fixedSource) Name() string { return "fixed" }
func (f *fixedSource) Sample(context.Context, bool) (collector.Reading, error) {
	return collector.Reading{GPUs: f.gpus}, nil
}

// TestLeaseAttribution: a process belongs to a lease by the PID `gpupool
// run` reported (or an ancestor of it), or by its pod; use is reported
// relative to the share and memory granted, with overuse, and allowlisted
// pod labels.
func TestLeaseAttribution(t *testing.T) {
	const gib = 1 << 30
	src := &fixedSource{gpus: []collector.GPU{{
		Index: 0, UUID: "GPU-0", Model: "H100", MemoryBytes: 80 * gib, Healthy: true,
		Processes: []collector.Process{
			{PID: 5001, MemoryUsedBytes: 10 * gib, SMUtilization: 0.30}, // child of 5000, reported by gpupool run
			{PID: 4242, MemoryUsedBytes: 30 * gib, SMUtilization: 0.20}, // in the trainer's pod, by its cgroup
			{PID: 8000, MemoryUsedBytes: 1 * gib, SMUtilization: 0.05},  // nobody's
		},
	}}}
	sampler := collector.NewSampler(src, time.Second, 1, nil)
	sampler.Round(context.Background())
	d := New(Config{
		Inventory: inventory.Server{Name: "gpu-a"}, Samplers: []*collector.Sampler{sampler},
		LabelAllowlist: []string{"app"}, Parent: ProcParent("testdata/proc"),
		PodOf: func(pid int) string { return PodUID("testdata/proc", pid) },
	})
	d.leases = []allocator.Lease{
		{ID: "lease-000001", Namespace: "ml", Server: "gpu-a", GPUs: []allocator.LeaseGPU{{Index: 0, Share: 500, MemoryBytes: 40 * gib}}},
		{ID: "lease-000002", Namespace: "ml", Server: "gpu-a", Owner: allocator.Owner{Pod: "trainer-0", UID: "6f1d1c8e-2b4a-4f7e-9a35-0c1d2e3f4a5b", Labels: map[string]string{"app": "tf-training", "team": "x"}},
			GPUs: []allocator.LeaseGPU{{Index: 0, Share: 250, MemoryBytes: 20 * gib}}},
	}
	if err := d.RegisterPID(5000, "lease-000001"); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(NewLeaseCollector(d))
	want := `
# HELP bitfusion_gpu_unattributed_processes Processes on the GPU that belong to no lease on this server.
# TYPE bitfusion_gpu_unattributed_processes gauge
bitfusion_gpu_unattributed_processes{gpu="0",server="gpu-a"} 1
# HELP bitfusion_lease_gpu_utilization SM use of the lease's processes on the GPU relative to the share granted (1 = all of its share).
# TYPE bitfusion_lease_gpu_utilization gauge
bitfusion_lease_gpu_utilization{gpu="0",label_app="",lease="lease-000001",namespace="ml",pod="",server="gpu-a"} 0.6
bitfusion_lease_gpu_utilization{gpu="0",label_app="tf-training",lease="lease-000002",namespace="ml",pod="trainer-0",server="gpu-a"} 0.8
# HELP bitfusion_lease_memory_overuse_bytes GPU memory the lease uses beyond what it was granted (0 when within).
# TYPE bitfusion_lease_memory_overuse_bytes gauge
bitfusion_lease_memory_overuse_bytes{gpu="0",label_app="",lease="lease-000001",namespace="ml",pod="",server="gpu-a"} 0
bitfusion_lease_memory_overuse_bytes{gpu="0",label_app="tf-training",lease="lease-000002",namespace="ml",pod="trainer-0",server="gpu-a"} 1.073741824e+10
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"bitfusion_gpu_unattributed_processes", "bitfusion_lease_gpu_utilization", "bitfusion_lease_memory_overuse_bytes"); err != nil {
		t.Error(err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

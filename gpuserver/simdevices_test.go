package gpuserver

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/fakegpu"
)

// simulatedDevicesHost is a host named gpu-a on two simulated GPUs that
// are files under dir/dev, its processes read from proc, its allocator
// answering leases.
func simulatedDevicesHost(t *testing.T, dir, proc string, demand map[string]float64, leases ...allocator.Lease) (*Host, *fakegpu.Source) {
	t.Helper()
	now := time.Unix(1.8e9, 0)
	sim := &fakegpu.Source{Server: "gpu-a", Seed: 7,
		GPUs:      []fakegpu.GPU{{Model: "H100", MemoryBytes: 80 << 30}, {Model: "H100", MemoryBytes: 80 << 30}},
		Demand:    func([]allocator.Lease, time.Time) map[string]float64 { return demand },
		DeviceDir: filepath.Join(dir, "dev"),
	}
	if err := sim.CreateDeviceFiles(); err != nil {
		t.Fatal(err)
	}
	h, err := NewHost(HostConfig{
		Config: Config{Inventory: sim.Inventory(0, 0, nil), Client: leasesServer(t, leases...), LabelAllowlist: []string{"app"},
			Clock: func() time.Time { return now }, Log: slog.New(slog.DiscardHandler)},
		Source: sim, Interval: time.Second, ProcessEvery: 5, Proc: proc,
	})
	if err != nil {
		t.Fatal(err)
	}
	return h, sim
}

// fakeProcess writes process pid into the fake procfs proc: its cgroup
// file and, in its fd directory, a descriptor for each file it holds.
func fakeProcess(t *testing.T, proc string, pid int, cgroup string, holds ...string) {
	t.Helper()
	dir := filepath.Join(proc, strconv.Itoa(pid))
	if err := os.MkdirAll(filepath.Join(dir, "fd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, f := range holds {
		if err := os.Symlink(f, filepath.Join(dir, "fd", strconv.Itoa(3+i))); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSimulatedDevicesAttributedByCgroup: the processes holding a
// simulated GPU's file are attributed as on a real GPU, by the pod their
// cgroup names (the kubelet's systemd or cgroupfs layout) to the lease
// that pod owns, whose series carry the pod's name and labels: two
// containers of one pod are two processes of its lease, its work shared
// between them; a lease whose pod holds one of its GPUs only is idle on
// the other; a process in no pod is nobody's.
func TestSimulatedDevicesAttributedByCgroup(t *testing.T) {
	const (
		trainer = "6f1d1c8e-2b4a-4f7e-9a35-0c1d2e3f4a5b"
		job     = "0d3c8c51-4f6e-4a4b-8d9e-1c2b3a4f5e6d"
	)
	leases := []allocator.Lease{
		{ID: "lease-000001", Namespace: "ml", Server: "gpu-a",
			Owner: allocator.Owner{Pod: "trainer-0", UID: trainer, Labels: map[string]string{"app": "tf-training"}},
			GPUs:  []allocator.LeaseGPU{{Index: 0, Share: 500, MemoryBytes: 40 << 30}}},
		{ID: "lease-000002", Namespace: "team-b", Server: "gpu-a",
			Owner: allocator.Owner{Pod: "job-1", UID: job, Labels: map[string]string{"app": "batch"}},
			GPUs:  []allocator.LeaseGPU{{Index: 0, Share: 250, MemoryBytes: 20 << 30}, {Index: 1, Share: 250, MemoryBytes: 20 << 30}}},
	}
	dir := t.TempDir()
	proc := filepath.Join(dir, "proc")
	h, sim := simulatedDevicesHost(t, dir, proc, map[string]float64{"lease-000001": 0.75, "lease-000002": 0.5}, leases...)
	// Inside its container a process opens the file at the path the
	// device plugin mounts it at, not the daemon's.
	container := filepath.Join(dir, "container")
	if err := os.Symlink(sim.DeviceDir, container); err != nil {
		t.Fatal(err)
	}
	gpu := func(i int) string { return filepath.Join(container, sim.UUID(i)) }
	systemdPod := "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(trainer, "-", "_") + ".slice/cri-containerd-"
	fakeProcess(t, proc, 4242, systemdPod+"0123abcd.scope", gpu(0))
	fakeProcess(t, proc, 4250, systemdPod+"4567cdef.scope", gpu(0))
	fakeProcess(t, proc, 5000, "0::/kubepods/besteffort/pod"+job+"/89abcdef", gpu(1))
	fakeProcess(t, proc, 6000, "0::/user.slice/user-1000.slice/session-1.scope", gpu(1))

	ctx := context.Background()
	h.Daemon.refreshLeases(ctx)
	h.Sampler.Round(ctx)
	want := `
# HELP bitfusion_gpu_unattributed_processes Processes on the GPU that belong to no lease on this server.
# TYPE bitfusion_gpu_unattributed_processes gauge
bitfusion_gpu_unattributed_processes{gpu="0",server="gpu-a"} 0
bitfusion_gpu_unattributed_processes{gpu="1",server="gpu-a"} 1
# HELP bitfusion_lease_gpu_utilization SM use of the lease's processes on the GPU relative to the share granted (1 = all of its share).
# TYPE bitfusion_lease_gpu_utilization gauge
bitfusion_lease_gpu_utilization{gpu="0",label_app="batch",lease="lease-000002",namespace="team-b",pod="job-1",server="gpu-a"} 0
bitfusion_lease_gpu_utilization{gpu="0",label_app="tf-training",lease="lease-000001",namespace="ml",pod="trainer-0",server="gpu-a"} 0.75
bitfusion_lease_gpu_utilization{gpu="1",label_app="batch",lease="lease-000002",namespace="team-b",pod="job-1",server="gpu-a"} 0.5
# HELP bitfusion_lease_processes Processes attributed to the lease on the GPU.
# TYPE bitfusion_lease_processes gauge
bitfusion_lease_processes{gpu="0",label_app="batch",lease="lease-000002",namespace="team-b",pod="job-1",server="gpu-a"} 0
bitfusion_lease_processes{gpu="0",label_app="tf-training",lease="lease-000001",namespace="ml",pod="trainer-0",server="gpu-a"} 2
bitfusion_lease_processes{gpu="1",label_app="batch",lease="lease-000002",namespace="team-b",pod="job-1",server="gpu-a"} 1
`
	if err := testutil.GatherAndCompare(h.Registry, strings.NewReader(want),
		"bitfusion_gpu_unattributed_processes", "bitfusion_lease_gpu_utilization", "bitfusion_lease_processes"); err != nil {
		t.Error(err)
	}
}

// TestSimulatedDeviceHeldByAChild: a real process holding a simulated
// GPU's file open is found on that GPU in the host's procfs, and counted
// as nobody's (it runs in no pod and reported nothing).
func TestSimulatedDeviceHeldByAChild(t *testing.T) {
	h, sim := simulatedDevicesHost(t, t.TempDir(), "/proc", nil)
	f, err := os.Open(filepath.Join(sim.DeviceDir, sim.UUID(1)))
	if err != nil {
		t.Fatal(err)
	}
	child := startChild(t, f)
	_ = f.Close()
	ctx := context.Background()
	h.Daemon.refreshLeases(ctx)
	h.Sampler.Round(ctx)
	gpus := h.Sampler.Latest().GPUs
	if p := gpus[1].Processes; len(p) != 1 || p[0].PID != child {
		t.Fatalf("GPU 1 processes %+v, want the child %d alone", p, child)
	}
	if p := gpus[0].Processes; len(p) != 0 {
		t.Errorf("GPU 0 processes %+v, want none", p)
	}
	if _, unattributed := h.Daemon.Usage(); unattributed[0] != 0 || unattributed[1] != 1 {
		t.Errorf("unattributed processes %v, want the child on GPU 1", unattributed)
	}
}

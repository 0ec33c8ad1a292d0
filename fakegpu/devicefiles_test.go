package fakegpu

import (
	"context"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/collector"
)

// holdFiles makes a fake procfs under dir in which each PID holds the
// files listed, one descriptor each (a descriptor is a link to its file,
// as in /proc/<pid>/fd), and returns its path.
func holdFiles(t *testing.T, dir string, held map[int][]string) string {
	t.Helper()
	proc := filepath.Join(dir, "proc")
	for pid, files := range held {
		fdDir := filepath.Join(proc, strconv.Itoa(pid), "fd")
		if err := os.MkdirAll(fdDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for fd, f := range files {
			if err := os.Symlink(f, filepath.Join(fdDir, strconv.Itoa(fd+3))); err != nil {
				t.Fatal(err)
			}
		}
	}
	// What else a procfs holds: entries that are no process, and a
	// process whose descriptors cannot be read.
	for _, name := range []string{"meminfo", "4000"} {
		if err := os.WriteFile(filepath.Join(proc, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return proc
}

// TestSimulatedDevicesFollowTheirHolders: with device files, the processes
// on a simulated GPU are those that hold its file, by whatever path (the
// same file twice counts once, another of the same name not at all), each running its part of its
// pod's lease on that GPU; a process of no lease's pod uses nothing and a
// lease whose pod holds no file is idle. The rounds that read no processes
// keep the holders the last one found; a holder that ends is gone from the
// next that does, and a GPU whose file is gone is lost.
func TestSimulatedDevicesFollowTheirHolders(t *testing.T) {
	now := time.Unix(1.8e9, 0)
	leases := []allocator.Lease{
		{ID: "lease-000001", Owner: allocator.Owner{UID: "uid-a"},
			GPUs: []allocator.LeaseGPU{{Index: 0, Share: 500, MemoryBytes: 40 << 30}}},
		{ID: "lease-000002", Owner: allocator.Owner{UID: "uid-b"},
			GPUs: []allocator.LeaseGPU{{Index: 0, Share: 250, MemoryBytes: 20 << 30}, {Index: 1, Share: 250, MemoryBytes: 20 << 30}}},
		{ID: "lease-000003", Owner: allocator.Owner{UID: "uid-c"},
			GPUs: []allocator.LeaseGPU{{Index: 1, Share: 250, MemoryBytes: 20 << 30}}},
	}
	demand := map[string]float64{"lease-000001": 0.8, "lease-000002": 0.6, "lease-000003": 1}
	pods := map[int]string{100: "uid-a", 101: "uid-a", 200: "uid-b", 400: "uid-c"}
	dir := t.TempDir()
	sim := &Source{Server: "sim", Seed: 3, Clock: func() time.Time { return now },
		GPUs:      []GPU{{Model: "H100", MemoryBytes: 80 << 30}, {Model: "H100", MemoryBytes: 80 << 30}},
		Leases:    func() []allocator.Lease { return leases },
		Demand:    func([]allocator.Lease, time.Time) map[string]float64 { return demand },
		DeviceDir: filepath.Join(dir, "dev"),
		PodOf:     func(pid int) string { return pods[pid] },
	}
	if err := sim.CreateDeviceFiles(); err != nil {
		t.Fatal(err)
	}
	gpu0, gpu1 := sim.deviceFile(0), sim.deviceFile(1)
	// A container sees the device files at a path of its own; a file of
	// the same name elsewhere is another file.
	if err := os.Symlink(sim.DeviceDir, filepath.Join(dir, "container")); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other", sim.UUID(1))
	if err := os.MkdirAll(filepath.Dir(other), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	sim.Proc = holdFiles(t, dir, map[int][]string{
		100: {other, gpu0, gpu0}, // pod a's two processes share its lease's work on GPU 0
		101: {filepath.Join(dir, "container", sim.UUID(0))},
		200: {gpu1}, // pod b holds GPU 1 only, of its lease's two
		300: {gpu1}, // in no lease's pod
		400: {other},
	})
	ctx := context.Background()
	sample := func(processes bool) []collector.GPU {
		t.Helper()
		r, err := sim.Sample(ctx, processes)
		if err != nil {
			t.Fatal(err)
		}
		return r.GPUs
	}
	memory := func(l *allocator.Lease, gpu int, part float64) int64 {
		return int64(float64(l.GPUs[gpu].MemoryBytes) * sim.memoryFactor(l) * part)
	}
	wantProcesses := func(when string, g collector.GPU, want []collector.Process) {
		t.Helper()
		if len(g.Processes) != len(want) {
			t.Fatalf("%s: GPU %d processes %+v, want %+v", when, g.Index, g.Processes, want)
		}
		for i, p := range g.Processes {
			w := want[i]
			if p.PID != w.PID || p.PodUID != "" || p.MemoryUsedBytes != w.MemoryUsedBytes || math.Abs(p.SMUtilization-w.SMUtilization) > 1e-9 {
				t.Errorf("%s: GPU %d process %d = %+v, want %+v with no pod (the daemon finds it)", when, g.Index, i, p, w)
			}
		}
	}
	wantUtilization := func(when string, g collector.GPU, busy float64) {
		t.Helper()
		if want := busy + 0.01*sim.noise(uint64(g.Index), now); math.Abs(g.Utilization-want) > 1e-9 {
			t.Errorf("%s: GPU %d utilization %v, want %v: its processes' sum and the idle noise", when, g.Index, g.Utilization, want)
		}
	}

	gpus := sample(true)
	a, b := &leases[0], &leases[1]
	wantProcesses("first round", gpus[0], []collector.Process{
		{PID: 100, SMUtilization: 0.5 * 0.8 / 2, MemoryUsedBytes: memory(a, 0, 0.5)},
		{PID: 101, SMUtilization: 0.5 * 0.8 / 2, MemoryUsedBytes: memory(a, 0, 0.5)},
	})
	wantProcesses("first round", gpus[1], []collector.Process{
		{PID: 200, SMUtilization: 0.25 * 0.6, MemoryUsedBytes: memory(b, 1, 1)},
		{PID: 300},
	})
	wantUtilization("first round", gpus[0], 0.5*0.8)
	wantUtilization("first round", gpus[1], 0.25*0.6)
	if want := 2*memory(a, 0, 0.5) + memory(b, 1, 1); gpus[0].MemoryUsedBytes+gpus[1].MemoryUsedBytes != want {
		t.Errorf("memory used %d + %d, want %d: the processes'", gpus[0].MemoryUsedBytes, gpus[1].MemoryUsedBytes, want)
	}

	now = now.Add(time.Second)
	demand["lease-000001"] = 0.4
	gpus = sample(false)
	if gpus[0].Processes != nil {
		t.Errorf("a round that reads no processes lists %+v", gpus[0].Processes)
	}
	wantUtilization("a round that reads no processes", gpus[0], 0.5*0.4)

	if err := os.RemoveAll(filepath.Join(sim.Proc, "101")); err != nil {
		t.Fatal(err)
	}
	gpus = sample(true)
	wantProcesses("101 ended", gpus[0], []collector.Process{{PID: 100, SMUtilization: 0.5 * 0.4, MemoryUsedBytes: memory(a, 0, 1)}})

	if err := os.Remove(gpu1); err != nil {
		t.Fatal(err)
	}
	gpus = sample(true)
	if g := gpus[1]; !errors.Is(g.Err, fs.ErrNotExist) || g.Healthy || g.Processes != nil || !math.IsNaN(g.Utilization) {
		t.Errorf("GPU 1 without its file = %+v, want lost: an error, unhealthy, no readings", g)
	}
	if g := gpus[0]; g.Err != nil || !g.Healthy {
		t.Errorf("GPU 0 = %+v, want it healthy still", g)
	}
}

// TestSimulatedDeviceHeldByThisProcess: the holders are found in the real
// procfs by the file's identity: this test process opening a device file
// is on its GPU while it holds it, and only then.
func TestSimulatedDeviceHeldByThisProcess(t *testing.T) {
	sim := &Source{Server: "sim", Seed: 3, Clock: time.Now,
		GPUs:      []GPU{{Model: "H100", MemoryBytes: 80 << 30}, {Model: "H100", MemoryBytes: 80 << 30}},
		DeviceDir: t.TempDir(), Proc: "/proc",
	}
	if err := sim.CreateDeviceFiles(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(sim.deviceFile(1))
	if err != nil {
		t.Fatal(err)
	}
	r, err := sim.Sample(context.Background(), true)
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if p := r.GPUs[1].Processes; len(p) != 1 || p[0].PID != os.Getpid() {
		t.Errorf("GPU 1 processes %+v, want this process (%d) alone", p, os.Getpid())
	}
	if p := r.GPUs[0].Processes; len(p) != 0 {
		t.Errorf("GPU 0 processes %+v, want none", p)
	}
	if r, _ = sim.Sample(context.Background(), true); len(r.GPUs[1].Processes) != 0 {
		t.Errorf("GPU 1 processes %+v once the file is closed, want none", r.GPUs[1].Processes)
	}
}

// BenchmarkDeviceHoldersScan is the pass over this host's /proc that each
// round reading the processes of simulated GPUs with device files makes,
// and reports how many processes and descriptors it read.
func BenchmarkDeviceHoldersScan(b *testing.B) {
	sim := &Source{Server: "sim", GPUs: []GPU{{Model: "H100"}}, DeviceDir: b.TempDir()}
	if err := sim.CreateDeviceFiles(); err != nil {
		b.Fatal(err)
	}
	files, _ := sim.deviceFiles()
	for b.Loop() {
		if _, err := holdersOf("/proc", files); err != nil {
			b.Fatal(err)
		}
	}
	processes, _ := filepath.Glob("/proc/[0-9]*/fd")
	descriptors, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	b.ReportMetric(float64(len(processes)), "processes")
	b.ReportMetric(float64(len(descriptors)), "descriptors")
}

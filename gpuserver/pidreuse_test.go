package gpuserver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/collector"
	gpuapi "github.com/gpupool/gpupool/gpuserver/api"
	"github.com/gpupool/gpupool/inventory"
)

// TestProcStartTime reads field 22 of stat, counted after the command
// name, which may hold spaces and parentheses.
func TestProcStartTime(t *testing.T) {
	self, ok := ProcStartTime("/proc")(os.Getpid())
	if again, _ := ProcStartTime("/proc")(os.Getpid()); !ok || self == 0 || again != self {
		t.Errorf("this process's start time: %d, %v, then %d", self, ok, again)
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "77"), 0o700); err != nil {
		t.Fatal(err)
	}
	stat := "77 (a) b (c)) S 1 77 77 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000 100\n"
	if err := os.WriteFile(filepath.Join(dir, "77", "stat"), []byte(stat), 0o600); err != nil {
		t.Fatal(err)
	}
	if start, ok := ProcStartTime(dir)(77); !ok || start != 123456 {
		t.Errorf("start time of %q = %d, %v; want 123456", stat, start, ok)
	}
	if _, ok := ProcStartTime(dir)(78); ok {
		t.Error("a gone process has a start time")
	}
}

// fakeStarts is Config.StartTime over a table a test edits.
type fakeStarts struct {
	mu     sync.Mutex
	starts map[int]uint64
}

func (f *fakeStarts) get(pid int) (uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.starts[pid]
	return s, ok
}

func (f *fakeStarts) set(pid int, start uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts[pid] = start
}

// TestReusedPIDIsNotAttributed: once a registered process ended and
// another (another tenant's) took its PID, the newcomer's use is not the
// lease's, and the entry is pruned.
func TestReusedPIDIsNotAttributed(t *testing.T) {
	src := &fixedSource{gpus: []collector.GPU{{
		Index: 0, UUID: "GPU-0", Model: "H100", MemoryBytes: 80 << 30, Healthy: true,
		Processes: []collector.Process{{PID: 5000, MemoryUsedBytes: 1 << 30, SMUtilization: 0.5}},
	}}}
	sampler := collector.NewSampler(src, time.Second, 1, nil)
	sampler.Round(context.Background())
	starts := &fakeStarts{starts: map[int]uint64{5000: 100}}
	d := New(Config{Inventory: inventory.Server{Name: "gpu-a"}, Samplers: []*collector.Sampler{sampler}, StartTime: starts.get})
	lease := allocator.Lease{ID: "lease-000001", Namespace: "ml", Server: "gpu-a", GPUs: []allocator.LeaseGPU{{Index: 0, Share: 1000, MemoryBytes: 80 << 30}}}
	d.mu.Lock()
	d.setLeases([]allocator.Lease{lease})
	d.mu.Unlock()
	if err := d.RegisterPID(5000, lease.ID); err != nil {
		t.Fatal(err)
	}
	use, unattributed := d.Usage()
	if u := use[gpuapi.LeaseGPU{Lease: lease.ID, GPU: 0}]; u == nil || u.Processes != 1 || unattributed[0] != 0 {
		t.Fatalf("the registered process: use %+v, unattributed %v; want it the lease's", u, unattributed)
	}

	starts.set(5000, 200) // it ended; a later process has its PID
	use, unattributed = d.Usage()
	if u := use[gpuapi.LeaseGPU{Lease: lease.ID, GPU: 0}]; u != nil && u.Processes != 0 || unattributed[0] != 1 {
		t.Errorf("a process that took a registered PID: use %+v, unattributed %v; want it nobody's", u, unattributed)
	}
	d.pruneGone()
	if len(d.pids) != 0 {
		t.Errorf("after pruning the registry holds %v, want the reused PID gone", d.pids)
	}
	if err := d.RegisterPID(4999, lease.ID); err == nil {
		t.Error("registered a process that has no start time (gone)")
	}
}

// TestProcessReportFromAReplacedProcess: a report is taken only if the
// sender, and the process it reports, are still the ones the daemon
// checked once the allocator answered, not later ones with their PIDs.
func TestProcessReportFromAReplacedProcess(t *testing.T) {
	self := os.Getpid()
	selfStart, _ := ProcStartTime("/proc")(self)
	var mu sync.Mutex
	calls := map[int]uint64{}
	replaced := 0 // the PID whose start time changes at every read
	r := newReportRig(t, &leaseAllocator{leases: []allocator.Lease{leaseA}}, func(c *Config) {
		c.StartTime = func(pid int) (uint64, bool) {
			mu.Lock()
			defer mu.Unlock()
			if pid == replaced {
				calls[pid]++
				return 1000 + calls[pid], true
			}
			if pid == self {
				return selfStart, true
			}
			return ProcStartTime("/proc")(pid)
		}
	})
	setReplaced := func(pid int) { mu.Lock(); defer mu.Unlock(); replaced = pid }

	setReplaced(self)
	err := r.report("", gpuapi.ProcessReport{Lease: leaseA.ID})
	wantRefusal(t, err, api.ReasonInvalid, "")
	if e := (*api.Error)(nil); asAPIError(err, &e) && !strings.Contains(e.Message, "ended") {
		t.Errorf("a replaced sender is refused with %q, want it to say the sender ended", e.Message)
	}

	child := startChild(t)
	setReplaced(child)
	err = r.report("", gpuapi.ProcessReport{PID: child, Lease: leaseA.ID})
	wantRefusal(t, err, api.ReasonInvalid, "pid")
	if got := r.registered(); len(got) != 0 {
		t.Errorf("registered %v from replaced processes", got)
	}

	setReplaced(0)
	if err := r.report("", gpuapi.ProcessReport{PID: child, Lease: leaseA.ID}); err != nil {
		t.Fatalf("the same child, not replaced: %v", err)
	}
	r.d.mu.Lock()
	e := r.d.pids[child]
	r.d.mu.Unlock()
	if want, _ := ProcStartTime("/proc")(child); e.start != want || want == 0 {
		t.Errorf("the child's entry records start time %d, want %d", e.start, want)
	}
}

func asAPIError(err error, e **api.Error) bool {
	var a *api.Error
	ok := err != nil && errors.As(err, &a)
	*e = a
	return ok
}

// TestPruneKeepsAReportTakenDuringTheLookup: a report registered while
// pruneGone looks processes up (without the lock) is not dropped for what
// the look-up said of the PID's previous process.
func TestPruneKeepsAReportTakenDuringTheLookup(t *testing.T) {
	var d *Daemon
	starts := &fakeStarts{starts: map[int]uint64{6000: 100}}
	now := time.Unix(1.8e9, 0)
	var lookingUp atomic.Bool
	d = New(Config{
		Clock: func() time.Time { return now },
		StartTime: func(pid int) (uint64, bool) {
			if pid == 6000 && lookingUp.CompareAndSwap(true, false) {
				// The registered process ended and a new one with its
				// PID is reported, all during the look-up, which still
				// finds the first one gone.
				starts.set(6000, 200)
				now = now.Add(time.Second)
				if err := d.RegisterPID(6000, "lease-000002"); err != nil {
					t.Error(err)
				}
				return 0, false
			}
			return starts.get(pid)
		},
	})
	if err := d.RegisterPID(6000, "lease-000001"); err != nil {
		t.Fatal(err)
	}
	lookingUp.Store(true)
	d.pruneGone()
	if e, ok := d.pids[6000]; !ok || e.lease != "lease-000002" || e.start != 200 {
		t.Errorf("after pruning PID 6000 is %+v (%v), want the report taken during the look-up", e, ok)
	}
}

// TestNoUnattributedCountBeforeTheLeases: before the daemon first fetched
// its leases no process can be attributed, so none is counted as
// unattributed (a restart must not fire the alerts on that count); once
// the leases are known, the processes of none are.
func TestNoUnattributedCountBeforeTheLeases(t *testing.T) {
	src := &fixedSource{gpus: []collector.GPU{{
		Index: 0, UUID: "GPU-0", Model: "H100", MemoryBytes: 80 << 30, Healthy: true,
		Processes: []collector.Process{{PID: 5000, MemoryUsedBytes: 1 << 30}, {PID: 5001, MemoryUsedBytes: 1 << 30}},
	}}}
	sampler := collector.NewSampler(src, time.Second, 1, nil)
	sampler.Round(context.Background())
	d := New(Config{Inventory: inventory.Server{Name: "gpu-a"}, Samplers: []*collector.Sampler{sampler}})
	reg := prometheus.NewRegistry()
	leases := NewLeaseCollector(d)
	reg.MustRegister(leases)
	leases.Render()
	if n, err := testutil.GatherAndCount(reg, "bitfusion_gpu_unattributed_processes"); err != nil || n != 0 {
		t.Errorf("before the leases are known: %d unattributed series (%v), want none", n, err)
	}
	d.mu.Lock()
	d.setLeases(nil) // fetched: no lease on this server
	d.mu.Unlock()
	leases.Render()
	want := `
# HELP bitfusion_gpu_unattributed_processes Processes on the GPU that belong to no lease on this server.
# TYPE bitfusion_gpu_unattributed_processes gauge
bitfusion_gpu_unattributed_processes{gpu="0",server="gpu-a"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "bitfusion_gpu_unattributed_processes"); err != nil {
		t.Error(err)
	}
}

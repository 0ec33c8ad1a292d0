package gpuserver

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gpupool/gpupool/fakegpu"
	gpuapi "github.com/gpupool/gpupool/gpuserver/api"
	"github.com/gpupool/gpupool/inventory"
)

// The simulated GPUs follow the daemon that samples them; NewHost knows
// them by this interface alone.
var _ followsDaemon = (*fakegpu.Source)(nil)

// TestHostRunsOnItsClock: a host assembled on a fake clock dates its
// snapshots, judges their staleness, measures its latency window and
// drives its simulated GPUs by that clock alone.
func TestHostRunsOnItsClock(t *testing.T) {
	now := time.Unix(1.8e9, 0)
	sim := &fakegpu.Source{Server: "gpu-a", Seed: 1, GPUs: []fakegpu.GPU{{Model: "H100", MemoryBytes: 80 << 30}}}
	h, err := NewHost(HostConfig{
		Config: Config{Inventory: sim.Inventory(0, 0, nil), Clock: func() time.Time { return now }},
		Source: sim, Interval: time.Second, ProcessEvery: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := sim.Clock(); !got.Equal(now) {
		t.Errorf("the simulated GPUs' clock reads %v, want the host's %v", got, now)
	}
	ctx := context.Background()
	h.Sampler.Round(ctx) // marks the latency window's start
	h.Daemon.latency.WithLabelValues("gpu-a", "client-node-1", gpuapi.TransportTCP).Observe(42e-6)
	now = now.Add(90 * time.Second)
	h.Sampler.Round(ctx)
	rep := h.Daemon.UsageReport()
	if !rep.SampledAt.Equal(now) {
		t.Errorf("sampled at %v, want the host's clock, %v", rep.SampledAt, now)
	}
	if len(rep.Latency) != 1 || rep.Latency[0].Window != 90*time.Second || rep.Latency[0].Count != 1 {
		t.Errorf("latency windows %+v, want one of 90s by the host's clock with the round trip in it", rep.Latency)
	}
	if !h.Daemon.health()[sim.UUID(0)] {
		t.Error("a GPU just sampled is unhealthy")
	}
	now = now.Add((staleRounds + 1) * time.Second)
	if h.Daemon.health()[sim.UUID(0)] {
		t.Errorf("a snapshot %d intervals old by the host's clock still vouches for its GPU", staleRounds+1)
	}
}

// TestHostReadsProcAndSys: a host reads processes' parents and pods from
// the procfs it is given, and a sysfs without RDMA ports gives no RDMA
// counters, which it logs.
func TestHostReadsProcAndSys(t *testing.T) {
	var logged bytes.Buffer
	h, err := NewHost(HostConfig{
		Config: Config{Inventory: inventory.Server{Name: "gpu-a"}, Log: slog.New(slog.NewTextHandler(&logged, nil))},
		Source: &fixedSource{}, Interval: time.Second, Proc: "testdata/proc", Sysfs: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if parent, ok := h.Daemon.cfg.Parent(5001); !ok || parent != 5000 {
		t.Errorf("parent of 5001 = %d, %v; want 5000 from testdata/proc", parent, ok)
	}
	if pod := h.Daemon.cfg.PodOf(4242); pod != "6f1d1c8e-2b4a-4f7e-9a35-0c1d2e3f4a5b" {
		t.Errorf("pod of 4242 = %q, want its cgroup's in testdata/proc", pod)
	}
	if h.Fabric != nil || !strings.Contains(logged.String(), "no RDMA ports") {
		t.Errorf("a sysfs without class/infiniband: fabric %v, log %q; want none, and said", h.Fabric, logged.String())
	}
}

// TestHostStopsWhenAServerFails: a listener that fails stops the whole
// host, which returns the failure.
func TestHostStopsWhenAServerFails(t *testing.T) {
	h, err := NewHost(HostConfig{
		Config: Config{Inventory: inventory.Server{Name: "gpu-a"}, Client: leasesServer(t), Heartbeat: time.Hour, Log: slog.New(slog.DiscardHandler)},
		Source: &fixedSource{}, Interval: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_ = ln.Close()
	if err := h.Serve(context.Background(), Listeners{HTTP: ln}); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Serve on a closed listener: %v, want its error", err)
	}
}

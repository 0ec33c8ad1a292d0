package gpuserver

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/allocator/service"
	"github.com/gpupool/gpupool/allocator/store"
	"github.com/gpupool/gpupool/fakegpu"
	"github.com/gpupool/gpupool/inventory"
)

// TestDaemonRegistersTheGPULinks: the daemon registers its GPUs' links with
// a real allocator, which checks them and stores them as the source gave
// them.
func TestDaemonRegistersTheGPULinks(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := store.OpenBolt(filepath.Join(t.TempDir(), "allocator"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	log := slog.New(slog.DiscardHandler)
	reg := prometheus.NewRegistry()
	svc, err := service.New(ctx, service.Config{Store: st, Policy: "best-fit", DefaultTTL: time.Hour, MaxTTL: time.Hour,
		HeartbeatTimeout: time.Minute, Registry: reg, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	allocatorSrv := httptest.NewServer(service.Handler(svc, nil, reg, log))
	defer allocatorSrv.Close()
	cl, err := client.New([]string{allocatorSrv.URL}, "")
	if err != nil {
		t.Fatal(err)
	}

	topology, err := fakegpu.ParseTopology("pcie", 4)
	if err != nil {
		t.Fatal(err)
	}
	sim := &fakegpu.Source{Server: "gpu-a", Seed: 1, Topology: topology,
		GPUs: []fakegpu.GPU{{Model: "L40S", MemoryBytes: 48 << 30}, {Model: "L40S", MemoryBytes: 48 << 30},
			{Model: "L40S", MemoryBytes: 48 << 30}, {Model: "L40S", MemoryBytes: 48 << 30}}}
	host, err := NewHost(HostConfig{
		Config: Config{Inventory: sim.Inventory(0, 0, nil), Client: cl, Heartbeat: 20 * time.Millisecond, Log: log},
		Source: sim, Interval: time.Hour, ProcessEvery: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	host.Sampler.Round(ctx) // the daemon vouches for GPUs it has read
	go host.Daemon.Run(ctx)

	want := inventory.Topology{
		{inventory.LinkNVLink, inventory.LinkPCIeSwitch, inventory.LinkSocket, inventory.LinkSocket},
		{inventory.LinkPCIeSwitch, inventory.LinkNVLink, inventory.LinkSocket, inventory.LinkSocket},
		{inventory.LinkSocket, inventory.LinkSocket, inventory.LinkNVLink, inventory.LinkPCIeSwitch},
		{inventory.LinkSocket, inventory.LinkSocket, inventory.LinkPCIeSwitch, inventory.LinkNVLink},
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		state, err := st.Load(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(state.Servers) == 1 {
			var got inventory.Topology
			for _, g := range state.Servers[0].GPUs {
				got = append(got, g.Links)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("stored links\n%v\nwant\n%v", got, want)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the daemon did not register")
		}
	}
}

package service

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/internal/metricstest"
	"github.com/gpupool/gpupool/inventory"
)

// TestMetricsGolden exports a known pool and compares the exposition with
// testdata/metrics.golden. Durations vary run to run and are left out;
// promtool checks the whole exposition, durations included.
func TestMetricsGolden(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1.8e9, 0)}
	a := startAllocator(t, t.TempDir(), clock, map[string]allocator.Share{"team-a": allocator.SharePercent(150)})
	ctx := context.Background()
	admin := a.client(t, adminToken)
	for _, s := range []string{"s1", "s2"} {
		if err := admin.RegisterServer(ctx, gpuServer(s, 2)); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []api.AcquireRequest{
		{Namespace: "team-a", GPUAmount: 1, GPUPercent: 50, Owner: podOwner("trainer-0")},
		{Namespace: "team-a", GPUAmount: 1, GPUMemory: "40Gi", Owner: podOwner("trainer-1")},
		{Namespace: "team-b", GPUAmount: 2, Owner: podOwner("big-0")},
		{Namespace: "team-a", GPUAmount: 1, GPUPercent: 60},                                                  // over quota
		{Namespace: "team-b", GPUAmount: 1, GPUPercent: 10, Owner: podOwner("serve-0"), UntilReleased: true}, // no expiry
	} {
		_, _ = admin.Acquire(ctx, r)
	}
	if err := admin.Heartbeat(ctx, "s2", api.Heartbeat{GPUs: []api.GPUHealth{{Index: 1, Healthy: false}}}); err != nil {
		t.Fatal(err)
	}

	if err := admin.SetQuota(ctx, "team-b", allocator.SharePercent(350)); err != nil {
		t.Fatal(err)
	}

	metricstest.Golden(t, a.reg, "testdata/metrics.golden",
		"bitfusion_lease_acquisition_duration_seconds", "bitfusion_store_apply_duration_seconds")
}

// TestMetricsDocumented checks docs/metrics.md's allocator section against
// the allocator's metric table, both ways, and the table against what the
// service exports.
func TestMetricsDocumented(t *testing.T) {
	a := startAllocator(t, t.TempDir(), &fakeClock{now: time.Unix(1.8e9, 0)}, map[string]allocator.Share{"ns": allocator.WholeGPU})
	admin := a.client(t, adminToken)
	if err := admin.RegisterServer(context.Background(), gpuServer("s1", 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Acquire(context.Background(), api.AcquireRequest{Namespace: "ns", GPUAmount: 1}); err != nil {
		t.Fatal(err)
	}
	metricstest.Documented(t, "../../docs/metrics.md", "Allocator", MetricFamilies, a.reg)
}

// TestMultiGPULeasesByLink: each namespace's multi-GPU leases are counted
// by the link their GPUs have, any on a server that reports no links;
// single-GPU leases are left out.
func TestMultiGPULeasesByLink(t *testing.T) {
	a := startAllocator(t, t.TempDir(), &fakeClock{now: time.Unix(1.8e9, 0)}, nil)
	ctx := context.Background()
	admin := a.client(t, adminToken)
	for _, s := range []api.Server{linkedServer("linked", inventory.PCIeTopology(4, 2, 1)), gpuServer("plain", 3)} {
		if err := admin.RegisterServer(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []api.AcquireRequest{
		{Namespace: "team-a", GPUAmount: 2, Servers: []string{"linked"}},
		{Namespace: "team-a", GPUAmount: 2, Servers: []string{"linked"}},
		{Namespace: "team-b", GPUAmount: 2, Servers: []string{"plain"}},
		{Namespace: "team-b", GPUAmount: 1, GPUPercent: 10},
	} {
		if _, err := admin.Acquire(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	want := `
# HELP bitfusion_namespace_multi_gpu_leases Live leases of more than one GPU, by the link all their GPUs have (any, socket, pcie-switch, nvlink).
# TYPE bitfusion_namespace_multi_gpu_leases gauge
bitfusion_namespace_multi_gpu_leases{link="any",namespace="team-b"} 1
bitfusion_namespace_multi_gpu_leases{link="pcie-switch",namespace="team-a"} 2
`
	if err := testutil.GatherAndCompare(a.reg, strings.NewReader(want), "bitfusion_namespace_multi_gpu_leases"); err != nil {
		t.Error(err)
	}
}

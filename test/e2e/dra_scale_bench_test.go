package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/inventory"
	"github.com/gpupool/gpupool/kube/dra"
	"github.com/gpupool/gpupool/simulate"
)

// draGPUMemory is every GPU's memory in BenchmarkDRAScale. OpenB gives
// shares of a GPU, not memory; a share asked as memory is the same share
// on every GPU only when all have the same memory, and a thousandth of
// 16,000 MiB is a whole 16 MiB, so each OpenB share (in milli-GPUs) is a
// whole number of bytes that the pool reads back as the same share.
const draGPUMemory = 16_000 << 20

// draBaseline is the policy whose replay stands for DRA's own allocator,
// which takes the first devices that fit.
const draBaseline = "first-fit"

// BenchmarkDRAScale places BenchmarkKubeScale's workload (the OpenB
// cluster's 1,213 servers as kwok nodes, the GPU pods seed 42 draws until
// their asks reach its 6,212 GPUs) as users of Dynamic Resource Allocation
// write it, at each rate of -kubescale.rates: each pod with a
// ResourceClaim of its own, of DeviceClass gpu.gpupool.io, for its GPUs by
// count and, for a share of one, that share of the GPU's memory. The same
// claims, the same ResourceSlices (dra.Resources: every GPU of 16,000 MiB,
// consumable by memory, each on its node by name), twice:
//
//   - pool: gpupool as deployed, GPUPool's PreFilter leasing each claim by
//     fgd-cpu and writing the lease as its allocation, DynamicResources
//     reserving it;
//   - stock: the stock kube-scheduler alone, DynamicResources' allocator
//     taking the first devices that fit on the node it scores best
//     (NodeResourcesFit's MostAllocated over CPU and memory, as a platform
//     team packing its nodes configures it); the claims tolerate the
//     pool's taint so that it may.
//
// Both sides' unallocated GPU share is read from the claims' allocations
// at the end (on the pool's side it must equal the allocator's, and each
// bound pod's claim must name exactly its lease's GPUs and memory). The
// pool's side fails above scaleMaxGap points from the in-process replay
// of fgd-cpu; the table says how far ahead of stock DRA it is against the
// replay's margin of fgd-cpu over first-fit.
func BenchmarkDRAScale(b *testing.B) {
	w := loadScaleWorkload(b)
	firstFit, err := simulate.PlaceInOrder(w.trace, w.pods, draBaseline, scaleSeed)
	if err != nil {
		b.Fatal(err)
	}
	for _, rate := range parseRates(b, *scaleRates) {
		var pool, stock *sideResult
		b.Run(fmt.Sprintf("rate=%g/pool", rate), func(b *testing.B) {
			for b.Loop() {
				pool = runPoolSide(b, w, rate, true)
			}
			b.ReportMetric(pool.unallocated, "pool-unallocated-pct")
		})
		b.Run(fmt.Sprintf("rate=%g/stock", rate), func(b *testing.B) {
			for b.Loop() {
				stock = runStockSide(b, w, rate, true)
			}
			b.ReportMetric(stock.unallocated, "stock-unallocated-pct")
			b.ReportMetric(stock.unallocated-firstFit, "points-from-first-fit-replay")
		})
		if pool != nil && stock != nil {
			t := sideBySide(fmt.Sprintf("%.0f pods a second asked, %d OpenB pods as ResourceClaims on 1,213 nodes", rate, len(w.pods)), pool, stock)
			fmt.Fprintf(t, "| GPU share unallocated (replay in arrival order: %s / %s) | %.2f%% (%.2f%%) | %.2f%% (%.2f%%) | |\n",
				scalePolicy, draBaseline, pool.unallocated, w.replayed, stock.unallocated, firstFit)
			fmt.Fprintf(t, "| points ahead of stock DRA (the replay's %s over %s) | %.2f | | (target ≥ %.2f) |\n",
				scalePolicy, draBaseline, stock.unallocated-pool.unallocated, firstFit-w.replayed)
			fmt.Print(t.String())
		}
	}
}

// withGPUMemory is servers with draGPUMemory on every GPU.
func withGPUMemory(servers []inventory.Server) []inventory.Server {
	out := make([]inventory.Server, len(servers))
	for i, s := range servers {
		s.GPUs = append([]inventory.GPU(nil), s.GPUs...)
		for k := range s.GPUs {
			s.GPUs[k].MemoryBytes = draGPUMemory
		}
		out[i] = s
	}
	return out
}

// claimArrivals are the workload's pods, of schedulerName (the default
// one for ""), each with its claim named as itself: count GPUs, and for a
// share of one the share's memory; tolerating the pool's taint, so that
// the same claim is stock DRA's to allocate too.
func claimArrivals(w *scaleWorkload, schedulerName string) arrivals {
	return func(i int) (*corev1.Pod, *resourceapi.ResourceClaim) {
		p, name := &w.pods[i], podName(i)
		memory := ""
		if p.PerGPU < allocator.WholeGPU {
			memory = resource.NewQuantity(int64(p.PerGPU)*draGPUMemory/int64(allocator.WholeGPU), resource.BinarySI).String()
		}
		spec := claimFor(int64(p.GPUs), memory)
		spec.Devices.Requests[0].Exactly.Tolerations = []resourceapi.DeviceToleration{{Key: dra.PlacedByThePool.Key, Operator: resourceapi.DeviceTolerationOpExists, Effect: dra.PlacedByThePool.Effect}}
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
		pod := claimPodSpec(name)
		pod.Labels = map[string]string{"trace-pod": p.Name}
		pod.Spec.SchedulerName = schedulerName
		pod.Spec.Containers[0].Resources.Requests = hostRequests(p)
		return pod, claim
	}
}

// publishSlices publishes the servers' ResourceSlices, those
// gpupool-scheduler publishes (dra.Slices), from the benchmark, for a side
// without the pool.
func publishSlices(b *testing.B, ctx context.Context, c kubernetes.Interface, servers []inventory.Server) {
	b.Helper()
	statuses := make([]api.ServerStatus, len(servers))
	for i, s := range servers {
		statuses[i] = api.ServerStatus{Name: s.Name, Schedulable: true, CPUMilli: s.CPUMilli}
		for _, g := range s.GPUs {
			statuses[i].GPUs = append(statuses[i].GPUs, api.GPUStatus{Index: g.Index, UUID: g.UUID, Model: g.Model, MemoryBytes: g.MemoryBytes, Healthy: g.Healthy})
		}
	}
	start := time.Now()
	for _, s := range dra.Slices(statuses) {
		if _, err := c.ResourceV1().ResourceSlices().Create(ctx, &s, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	waitForSlices(b, ctx, c, len(servers), start)
}

// waitForSlices waits until n ResourceSlices are published, which began
// at start.
func waitForSlices(b *testing.B, ctx context.Context, c kubernetes.Interface, n int, start time.Time) {
	b.Helper()
	for deadline := start.Add(5 * time.Minute); ; time.Sleep(time.Second) {
		slices, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err == nil && len(slices.Items) == n {
			fmt.Printf("%d ResourceSlices published in %v\n", n, time.Since(start).Round(100*time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("ResourceSlices: %v, want %d of them within 5 minutes (%v)", len(slices.Items), n, err)
		}
	}
}

// checkClaims reads the side's claims at the end: the GPU share their
// allocations hold is what the side left unallocated. On the pool's side
// (record set) it must be the allocator's, and the claim of every bound
// pod must name exactly its lease's GPUs and memory.
func (res *sideResult) checkClaims(b *testing.B, ctx context.Context, c kubernetes.Interface, capacity allocator.Share, record *scaleRecord) {
	b.Helper()
	claims, err := c.ResourceV1().ResourceClaims(scaleNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	var held allocator.Share
	allocated := map[string]*resourceapi.AllocationResult{}
	for i := range claims.Items {
		a := claims.Items[i].Status.Allocation
		if a == nil {
			continue
		}
		allocated[claims.Items[i].Name] = a
		for _, r := range a.Devices.Results {
			share := allocator.WholeGPU
			if q, ok := r.ConsumedCapacity[dra.CapacityMemory]; ok {
				share = allocator.Share(q.Value() * int64(allocator.WholeGPU) / draGPUMemory)
			}
			held += share
		}
	}
	fromClaims := 100 * float64(capacity-held) / float64(capacity)
	fmt.Printf("%s: %d claims allocated, holding %.2f GPUs: %.2f%% of the GPU share unallocated\n", res.name, len(allocated), held.GPUs(), fromClaims)
	if record == nil {
		res.unallocated = fromClaims
		return
	}
	if fromClaims != res.unallocated {
		b.Errorf("the claims' allocations leave %.2f%% of the GPU share unallocated, the allocator's leases %.2f%%", fromClaims, res.unallocated)
	}
	leases := map[string]api.Lease{}
	for _, l := range record.leases {
		leases[l.Owner.UID] = l
	}
	var differ []string
	for i := range record.pods {
		pod := &record.pods[i]
		if pod.Spec.NodeName == "" {
			continue
		}
		if lease, ok := leases[string(pod.UID)]; !ok || !allocatesLease(allocated[pod.Name], lease) {
			differ = append(differ, pod.Name)
		}
	}
	if len(differ) > 0 {
		b.Errorf("%d bound pods' claims are not allocated their lease's GPUs and memory: %s", len(differ), strings.Join(differ[:min(10, len(differ))], ", "))
	}
}

// allocatesLease reports whether a names exactly the lease's GPUs, and the
// memory it holds of each.
func allocatesLease(a *resourceapi.AllocationResult, l api.Lease) bool {
	if a == nil || !dra.AllocatesLease(a, l) {
		return false
	}
	for i, r := range a.Devices.Results {
		if q := r.ConsumedCapacity[dra.CapacityMemory]; q.Value() != l.GPUs[i].MemoryBytes {
			return false
		}
	}
	return true
}

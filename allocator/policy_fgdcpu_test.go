package allocator

import (
	"math"
	"testing"

	"github.com/gpupool/gpupool/inventory"
)

// TestFGDCPUKeepsScarceModels: a task that may run anywhere and asks for
// many cores would strand GPUs of a CPU-poor G2 server, so CPU stranding
// alone sends it to the CPU-rich T4 server; but half the workload can run
// only on T4, whose two GPUs are all it has, so fgd-cpu keeps them and the
// task goes to G2.
func TestFGDCPUKeepsScarceModels(t *testing.T) {
	c := NewCluster()
	for _, s := range []inventory.Server{
		{Name: "g2", CPUMilli: 96000, GPUs: gpusOf("G2", 8)},
		{Name: "t4", CPUMilli: 104000, GPUs: gpusOf("T4", 2)},
	} {
		if _, err := c.AddNode(&s); err != nil {
			t.Fatal(err)
		}
	}
	t4, _ := c.ModelSetOf([]string{"T4"})
	anywhere := TaskType{GPUs: 1, PerGPU: WholeGPU, CPUMilli: 8000, Weight: 0.5}
	onT4 := anywhere
	onT4.Models = t4
	cpuHungry := Demand{GPUs: 1, PerGPU: WholeGPU, CPUMilli: 48000}
	for _, tc := range []struct {
		work Workload
		want string
	}{
		{Workload{anywhere, onT4}, "g2"},
		// With no task bound to T4, stranding decides.
		{Workload{anywhere, {GPUs: 1, PerGPU: WholeGPU, CPUMilli: 8000, Weight: 0.5}}, "t4"},
	} {
		p, err := NewPolicy("fgd-cpu", PolicyOptions{Seed: 1, Workload: tc.work})
		if err != nil {
			t.Fatal(err)
		}
		where, ok := p.Place(c, &cpuHungry)
		if !ok || c.Nodes[where.Node].Name != tc.want {
			t.Errorf("workload %+v: placed on %v (%v), want %s", tc.work, where, ok, tc.want)
		}
	}
}

func gpusOf(model string, n int) []inventory.GPU {
	gpus := make([]inventory.GPU, n)
	for i := range gpus {
		gpus[i] = inventory.GPU{Index: i, Model: model, Healthy: true}
	}
	return gpus
}

// TestPressureOn: constrained share is split among the models a type takes
// by their GPUs; a model's pressure is its part of that share over its part
// of the GPUs, at most 1; below a tenth of the share, none.
func TestPressureOn(t *testing.T) {
	var gpus [maxModels]int
	gpus[0], gpus[1], gpus[2] = 60, 30, 10
	for _, tc := range []struct {
		name string
		work Workload
		want [3]float64
	}{
		{"one model", Workload{{GPUs: 1, PerGPU: 1000, Weight: 0.95}, {GPUs: 1, PerGPU: 1000, Models: 4, Weight: 0.05}}, [3]float64{0, 0, 0}},
		{"split by GPUs", Workload{{GPUs: 1, PerGPU: 1000, Weight: 0.8}, {GPUs: 1, PerGPU: 1000, Models: 6, Weight: 0.2}}, [3]float64{0, 0.5, 0.5}},
		{"capped", Workload{{GPUs: 1, PerGPU: 1000, Weight: 0.5}, {GPUs: 2, PerGPU: 500, Models: 4, Weight: 0.5}}, [3]float64{0, 0, 1}},
		{"no GPU tasks", Workload{{CPUMilli: 1000, Weight: 1}}, [3]float64{0, 0, 0}},
		{"no workload", nil, [3]float64{0, 0, 0}},
	} {
		p := pressureOn(tc.work, &gpus)
		for m, want := range tc.want {
			if d := p[m] - want; math.IsNaN(p[m]) || d > 1e-12 || d < -1e-12 {
				t.Errorf("%s: pressure on model %d = %v, want %v", tc.name, m, p[m], want)
			}
		}
	}
}

// TestPoliciesPlaceWithoutAWorkload: the allocator starts its policy with
// no workload (it learns one from the demands it sees), and every policy
// must place then.
func TestPoliciesPlaceWithoutAWorkload(t *testing.T) {
	c := NewCluster()
	s := inventory.Server{Name: "a", CPUMilli: 32000, GPUs: gpusOf("H100", 4)}
	if _, err := c.AddNode(&s); err != nil {
		t.Fatal(err)
	}
	for _, name := range PolicyNames() {
		p, err := NewPolicy(name, PolicyOptions{Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range []Demand{{GPUs: 1, PerGPU: WholeGPU / 2, CPUMilli: 1000}, {GPUs: 2, PerGPU: WholeGPU}} {
			if _, ok := p.Place(c, &d); !ok {
				t.Errorf("%s did not place %+v on an empty server", name, d)
			}
		}
	}
}

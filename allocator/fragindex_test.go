package allocator

import (
	"math"
	"math/rand/v2"
	"testing"
)

// randomNode is a node of up to 8 GPUs of models 1, 2 and 4, some used,
// some unhealthy, with or without CPU accounting.
func randomNode(rng *rand.Rand) Node {
	n := Node{Schedulable: rng.IntN(8) != 0}
	if rng.IntN(4) != 0 {
		n.CPUCap = 64000
		n.CPUFree = int64(rng.IntN(65)) * 1000
	}
	mixed := rng.IntN(3) == 0
	model := ModelSet(1) << rng.IntN(3)
	for range 1 + rng.IntN(8) {
		if mixed {
			model = ModelSet(1) << rng.IntN(3)
		}
		n.GPUs = append(n.GPUs, NodeGPU{Free: Share(rng.IntN(11)) * 100, Model: model, Healthy: rng.IntN(8) != 0})
		n.Models |= model
	}
	return n
}

// randomWorkload is the typical workload of n random demands, constrained
// to models when models.
func randomWorkload(rng *rand.Rand, n int, models bool) Workload {
	demands := make([]Demand, n)
	for i := range demands {
		demands[i] = Demand{GPUs: rng.IntN(4), PerGPU: Share(1+rng.IntN(10)) * 100, CPUMilli: int64(rng.IntN(5)) * 8000}
		if models && rng.IntN(2) == 0 {
			demands[i].Models = ModelSet(1 + rng.IntN(7))
		}
	}
	return TypicalWorkload(demands, 1)
}

// TestFragIndexIsFragmentation: the merged types measure what the
// workload's own types do, to the last bit when nothing merges.
func TestFragIndexIsFragmentation(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 2000 {
		models := round%2 == 0
		w := randomWorkload(rng, 1+rng.IntN(200), models)
		x := newFragIndex(w)
		for range 10 {
			n := randomNode(rng)
			want, got := w.Fragmentation(&n), x.fragmentation(&n)
			if models && math.Abs(got-want) > 1e-9*math.Max(1, want) || !models && got != want {
				t.Fatalf("round %d: node %+v: fragIndex %v, Workload.Fragmentation %v", round, n, got, want)
			}
		}
	}
}

// TestFragIndexMergesModelConstrainedTypes: types that differ only in
// models that all take a node's model are one type on that node.
func TestFragIndexMergesModelConstrainedTypes(t *testing.T) {
	w := Workload{
		{GPUs: 1, PerGPU: 500, CPUMilli: 4000, Weight: 0.5},
		{GPUs: 1, PerGPU: 500, CPUMilli: 4000, Models: 1, Weight: 0.25},
		{GPUs: 1, PerGPU: 500, CPUMilli: 4000, Models: 2, Weight: 0.125},
		{GPUs: 1, PerGPU: 500, CPUMilli: 4000, Models: 3, Weight: 0.125},
	}
	merged := newFragIndex(w).on(1).types
	if len(merged) != 2 || merged[0].weight != 0.875 || !merged[1].unusable {
		t.Errorf("on model 1: %+v, want the types of model 1 or any as one of weight 0.875, then the unusable one", merged)
	}
}

// TestFragIndexRemembersStatesExactly: a node state measured before
// measures the same again, to the last bit, whatever else the node differs
// in; states that differ in what counts (a GPU's free share, its health,
// free CPU either side of a type's ask) measure afresh.
func TestFragIndexRemembersStatesExactly(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 200 {
		w := randomWorkload(rng, 1+rng.IntN(50), round%2 == 0)
		remembering := newFragIndex(w)
		for range 200 {
			// Few GPUs, few shares and free CPU on and beside the asks
			// (multiples of 8000): states come back often.
			n := Node{Schedulable: rng.IntN(8) != 0, CPUCap: 64000, CPUFree: int64(rng.IntN(5))*8000 + int64(rng.IntN(3)-1)}
			if rng.IntN(4) == 0 {
				n.CPUCap, n.CPUFree = 0, 0
			}
			model := ModelSet(1) << rng.IntN(3)
			for range 1 + rng.IntN(3) {
				n.GPUs = append(n.GPUs, NodeGPU{Free: Share(rng.IntN(3)) * 500, Model: model, Healthy: rng.IntN(6) != 0})
				n.Models |= model
			}
			if got, want := remembering.fragmentation(&n), newFragIndex(w).fragmentation(&n); got != want {
				t.Fatalf("round %d: node %+v: remembered %v, measured afresh %v", round, n, got, want)
			}
		}
	}
}

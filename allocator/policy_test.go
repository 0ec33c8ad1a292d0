package allocator

import "testing"

// TestModelConstrainedDemandsShareRatings: a demand for some models rates
// a node whose every GPU is of one of them as the same demand for any model
// does, so it reuses those ratings; other nodes it rates itself.
func TestModelConstrainedDemandsShareRatings(t *testing.T) {
	c := NewCluster()
	for i, model := range []string{"T4", "T4", "V100"} {
		if _, err := c.AddNode(&Server{Name: model + string(rune('a'+i)), CPUMilli: 32000,
			GPUs: []GPU{{Model: model, Healthy: true}, {Index: 1, Model: model, Healthy: true}}}); err != nil {
			t.Fatal(err)
		}
	}
	t4, _ := c.ModelSetOf([]string{"T4"})
	rated := map[int]int{}
	rate := func(i int, _ *Node, _ *Demand) (int64, gpuMask) { rated[i]++; return int64(i), 1 }
	ties := newTieBreaker(1)
	anyModel := Demand{GPUs: 1, PerGPU: 500, CPUMilli: 4000}
	ties.pick(c, &anyModel, rate)
	onT4 := anyModel
	onT4.Models = t4
	where, ok := ties.pick(c, &onT4, rate)
	if !ok || where.Node != 1 {
		t.Errorf("T4 demand placed at %+v (%v), want node 1, the best T4 node", where, ok)
	}
	if rated[0] != 1 || rated[1] != 1 || rated[2] != 1 {
		t.Errorf("nodes rated %v times; want each once: the T4 nodes for both demands, the V100 node for neither T4 demand", rated)
	}
	if len(ties.cache.rows) != 1 {
		t.Errorf("%d rows of ratings kept, want 1: the T4 demand needs none of its own on nodes of one model", len(ties.cache.rows))
	}
}

package allocator

import (
	"testing"

	"github.com/gpupool/gpupool/inventory"
)

// TestModelConstrainedDemandsShareRatings: a demand for some models rates
// a node whose every GPU is of one of them as the same demand for any model
// does, so it reuses those ratings; other nodes it rates itself.
func TestModelConstrainedDemandsShareRatings(t *testing.T) {
	c := NewCluster()
	for i, model := range []string{"T4", "T4", "V100"} {
		if _, err := c.AddNode(&inventory.Server{Name: model + string(rune('a'+i)), CPUMilli: 32000,
			GPUs: []inventory.GPU{{Model: model, Healthy: true}, {Index: 1, Model: model, Healthy: true}}}); err != nil {
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
}

// TestRatingsCatchUpPastTheChangeLog: a row that fell behind further than
// the cluster's log of changes reaches rates every node afresh.
func TestRatingsCatchUpPastTheChangeLog(t *testing.T) {
	c := NewCluster()
	for i := range 2 {
		if _, err := c.AddNode(&inventory.Server{Name: string(rune('a' + i)), CPUMilli: int64(64000 - 32000*i),
			GPUs: []inventory.GPU{{Model: "T4", Healthy: true}}}); err != nil {
			t.Fatal(err)
		}
	}
	// Rates the node with the most free CPU best.
	rate := func(_ int, n *Node, _ *Demand) (int64, gpuMask) { return n.CPUFree, 1 }
	ties := newTieBreaker(1)
	small := Demand{CPUMilli: 100}
	if where, _ := ties.pick(c, &small, rate); where.Node != 0 {
		t.Fatalf("placed at node %d, want node 0, the one with more CPU free", where.Node)
	}
	// Node 0 is left with less CPU than node 1, then node 1 changes often
	// enough that the log starts over, out of reach of node 0's change.
	c.Commit(Placement{Node: 0}, &Demand{CPUMilli: 40000})
	for range 2 * (2*len(c.Nodes) + 64) {
		c.Commit(Placement{Node: 1}, &Demand{})
	}
	if _, ok := c.changedSince(1); ok {
		t.Fatal("the change log still reaches back to the first change; the test needs it not to")
	}
	if where, _ := ties.pick(c, &small, rate); where.Node != 1 {
		t.Errorf("placed at node %d, want node 1, the one with more CPU free", where.Node)
	}
}

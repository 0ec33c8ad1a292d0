package allocator

import (
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// TestCandidatesAreTheOnlyNodes checks every policy against what a node
// restriction must mean: placing a demand restricted to some nodes is
// placing it, decision for decision, on the same cluster where every other
// node takes nothing (unschedulable). The pool goes through a random use
// first so that nodes differ.
func TestCandidatesAreTheOnlyNodes(t *testing.T) {
	for _, policy := range PolicyNames() {
		t.Run(policy, func(t *testing.T) {
			d := newPoolDriver(t, policy, 3, startServers)
			rng := rand.New(rand.NewPCG(3, 9))
			restricted, err := NewPolicy(policy, d.opts)
			if err != nil {
				t.Fatal(err)
			}
			narrowed, err := NewPolicy(policy, d.opts)
			if err != nil {
				t.Fatal(err)
			}
			placed := 0
			for round := range 200 {
				for range 10 {
					d.step(byte(rng.IntN(256)), byte(rng.IntN(256)))
				}
				c := d.pool.cluster
				only, narrow := &NodeSet{}, cloneCluster(c)
				for i := range c.Nodes {
					if rng.IntN(2) == 0 {
						only.add(i)
					} else {
						narrow.Nodes[i].Schedulable = false
					}
				}
				demand := Demand{GPUs: rng.IntN(3), PerGPU: Share(rng.IntN(10)+1) * 100, CPUMilli: int64(rng.IntN(4)) * 4000}
				want, wantOK := narrowed.Place(narrow, &demand)
				demand.Nodes = only
				got, gotOK := restricted.Place(c, &demand)
				if gotOK != wantOK || !reflect.DeepEqual(got, want) {
					t.Fatalf("round %d: %+v restricted places at %v (%v), on the narrowed cluster at %v (%v)", round, demand, got, gotOK, want, wantOK)
				}
				if gotOK {
					placed++
				}
			}
			if placed < 50 {
				t.Fatalf("only %d of 200 restricted demands were placed: too few to test anything", placed)
			}
		})
	}
}

// cloneCluster copies c deeply enough to change its nodes.
func cloneCluster(c *Cluster) *Cluster {
	cc := *c
	cc.Nodes = slices.Clone(c.Nodes)
	for i := range cc.Nodes {
		cc.Nodes[i].GPUs = slices.Clone(c.Nodes[i].GPUs)
	}
	return &cc
}

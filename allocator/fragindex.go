package allocator

import "slices"

// fragIndex computes Workload.Fragmentation with the task types that
// count alike on a node merged. Model constraints multiply a workload's
// types (each set of models makes types of its own) but not the kinds of
// GPU demand: on a node whose every GPU is of a model a type takes, the
// type counts only by its GPUs, share and CPU, and a type that takes none
// of the node's models counts all of the node's free share. FGD then
// weighs a node against a handful of merged types instead of every type.
//
// Merged types keep the order of their first type, so a workload with no
// model constraints, where nothing merges, sums exactly as Fragmentation.
type fragIndex struct {
	w      Workload
	byNode map[ModelSet]*mergedTypes
	// last is the latest models looked up and lastMerged their types: a
	// policy weighs one node several times in a row.
	last       ModelSet
	lastMerged *mergedTypes
	// known is the fragmentation of node states already measured. Each
	// demand shape rates the nodes changed since it last placed, trying
	// each GPU it could take, so the same states come back across shapes
	// and across nodes alike (about 60% of measures on a workload with
	// model constraints); a state is the node's models, its healthy GPUs'
	// free shares and how many of the types' CPU asks its free CPU meets.
	known map[nodeState]float64
}

// maxKnownStates bounds fragIndex.known (about 1.5 MiB); past it the
// index starts over. A whole OpenB replay meets 9-14k states.
const maxKnownStates = 1 << 15

// nodeState is what fragmentation reads of a node whose types all count
// by share alone (no partial type) and that has at most
// maxStateGPUs healthy GPUs.
type nodeState struct {
	models      ModelSet
	frees       [maxStateGPUs]uint16 // healthy GPUs' free shares, most first
	healthy     uint8
	schedulable bool
	// cpuMet is how many of the types' distinct CPU asks the free CPU
	// meets; -1 for a node without CPU accounting.
	cpuMet int32
}

// maxStateGPUs is the most healthy GPUs a remembered state holds: OpenB's
// largest servers have eight.
const maxStateGPUs = 8

// mergedTypes is a workload's types merged for nodes of one set of models.
type mergedTypes struct {
	types []mergedType
	// cpuAsks are the types' distinct CPU asks, ascending: free CPU
	// matters only by how many of them it meets.
	cpuAsks []int64
	// partial is set when some type counts GPU by GPU, so a node's state
	// is more than its shares.
	partial bool
}

// mergedType is the task types that count alike on nodes of one set of
// models, with their summed weight.
type mergedType struct {
	gpus     int
	perGPU   Share
	cpuMilli int64
	// unusable types cannot run on such nodes at all (wrong model, no GPU).
	unusable bool
	// partial is set for a type that takes some of the node's models but
	// not all, which counts GPU by GPU and merges with no other.
	partial *TaskType
	weight  float64
}

func newFragIndex(w Workload) *fragIndex {
	return &fragIndex{w: w, byNode: map[ModelSet]*mergedTypes{}, known: map[nodeState]float64{}}
}

// on returns the workload merged for nodes whose GPUs are of the models.
func (x *fragIndex) on(models ModelSet) *mergedTypes {
	if x.lastMerged != nil && models == x.last {
		return x.lastMerged
	}
	m, ok := x.byNode[models]
	if !ok {
		m = x.merge(models)
		x.byNode[models] = m
	}
	x.last, x.lastMerged = models, m
	return m
}

// merge merges the workload's types for nodes whose GPUs are of the models.
func (x *fragIndex) merge(models ModelSet) *mergedTypes {
	var merged []mergedType
	index := map[mergedType]int{}
	for i := range x.w {
		t := &x.w[i]
		var k mergedType
		switch {
		case !t.Models.allows(models):
			k = mergedType{unusable: true}
		case t.GPUs == 0:
			k = mergedType{cpuMilli: t.CPUMilli, unusable: true}
		case t.Models == 0 || models&^t.Models == 0:
			k = mergedType{gpus: t.GPUs, perGPU: t.PerGPU, cpuMilli: t.CPUMilli}
		default:
			k = mergedType{partial: t}
		}
		j, ok := index[k]
		if !ok {
			j = len(merged)
			index[k] = j
			merged = append(merged, k)
		}
		merged[j].weight += t.Weight
	}
	m := &mergedTypes{types: merged}
	for _, k := range merged {
		m.partial = m.partial || k.partial != nil
		if i, found := slices.BinarySearch(m.cpuAsks, k.cpuMilli); !found {
			m.cpuAsks = slices.Insert(m.cpuAsks, i, k.cpuMilli)
		}
	}
	return m
}

// fragmentation is w.Fragmentation(n), up to the rounding of sums where
// types merged.
func (x *fragIndex) fragmentation(n *Node) float64 {
	healthy := healthyFrees(n)
	if healthy.sum == 0 {
		return 0
	}
	merged := x.on(n.Models)
	state, ok := merged.state(n, &healthy)
	if !ok {
		return merged.fragmentation(n, &healthy)
	}
	if f, ok := x.known[state]; ok {
		return f
	}
	if len(x.known) >= maxKnownStates {
		clear(x.known)
	}
	f := merged.fragmentation(n, &healthy)
	x.known[state] = f
	return f
}

// state is n's state as m's fragmentation reads it; false when it takes
// more than a nodeState holds.
func (m *mergedTypes) state(n *Node, healthy *freeShares) (nodeState, bool) {
	if m.partial || healthy.n > maxStateGPUs {
		return nodeState{}, false
	}
	s := nodeState{models: n.Models, healthy: uint8(healthy.n), schedulable: n.Schedulable, cpuMet: -1}
	for i := range healthy.n {
		if f := healthy.free[i]; f < 0 || f > WholeGPU {
			return nodeState{}, false
		}
		s.frees[i] = uint16(healthy.free[i])
	}
	if n.CPUCap > 0 {
		met, _ := slices.BinarySearch(m.cpuAsks, n.CPUFree+1)
		s.cpuMet = int32(met)
	}
	return s, true
}

// fragmentation sums, over m's types, the weight of each times the free
// share of n it cannot use.
func (m *mergedTypes) fragmentation(n *Node, healthy *freeShares) float64 {
	free := healthy.sum
	var f float64
	for i := range m.types {
		k := &m.types[i]
		frag := free
		switch {
		case k.unusable || !n.Schedulable || n.CPUCap > 0 && n.CPUFree < k.cpuMilli:
		case k.partial != nil:
			frag = k.partial.fragment(n, free)
		default:
			frag = healthy.unusableBy(k.gpus, k.perGPU)
		}
		f += k.weight * float64(frag)
	}
	return f
}

// freeShares are the free shares of a node's healthy GPUs, most first.
type freeShares struct {
	n    int
	free [MaxGPUsPerServer]Share
	sum  Share
}

func healthyFrees(n *Node) freeShares {
	var s freeShares
	for i := range n.GPUs {
		if !n.GPUs[i].Healthy {
			continue
		}
		// Insertion sort: a node has a handful of GPUs.
		f, j := n.GPUs[i].Free, s.n
		for ; j > 0 && s.free[j-1] < f; j-- {
			s.free[j] = s.free[j-1]
		}
		s.free[j] = f
		s.n++
		s.sum += f
	}
	return s
}

// unusableBy is the free share that a task of gpus GPUs of perGPU each
// cannot use: that of the GPUs with less than perGPU free, or all of it
// when fewer than gpus GPUs have that much.
func (s *freeShares) unusableBy(gpus int, perGPU Share) Share {
	fits, usable := 0, Share(0)
	for fits < s.n && s.free[fits] >= perGPU {
		usable += s.free[fits]
		fits++
	}
	if fits < gpus {
		return s.sum
	}
	return s.sum - usable
}

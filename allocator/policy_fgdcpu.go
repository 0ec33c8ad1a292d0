package allocator

import "math"

// newFGDCPU is gpupool's own policy: FGD that also counts GPU share
// stranded for want of CPU. FGD sees CPU only through the task types that
// no longer fit a node; it happily puts CPU-only tasks and CPU-hungry GPU
// tasks on nodes with few cores per GPU, and those GPUs then sit idle.
// fgd-cpu adds to a node's fragmentation the free GPU share its free CPU
// cannot feed at the workload's mean CPU per GPU share, so such tasks go
// where cores are plentiful. Growth is rounded to growthStep so that
// near-equal nodes tie and ties go to the same nodes (packing), as they do
// for FGD through its integer score.
func newFGDCPU(o PolicyOptions) Policy {
	w, cpuPerMilli := o.Workload, o.Workload.CPUPerMilli()
	measure := func(n *Node) float64 {
		return w.Fragmentation(n) + strandedByCPU(n, cpuPerMilli)
	}
	return &fragPolicy{
		name: "fgd-cpu", ties: newTieBreaker(o.Seed), frag: fragMemo{measure: measure},
		cost: func(growth float64) float64 { return growth / growthStep },
	}
}

// growthStep is the resolution, in milli-GPU, below which two placements
// count as equally good.
const growthStep = 20

// strandedByCPU is the free GPU share of n that its free CPU cannot feed
// when tasks use cpuPerMilli CPU per milli-GPU.
func strandedByCPU(n *Node, cpuPerMilli float64) float64 {
	if n.CPUCap == 0 || cpuPerMilli == 0 {
		return 0
	}
	return math.Max(0, float64(n.FreeShare())-float64(n.CPUFree)/cpuPerMilli)
}

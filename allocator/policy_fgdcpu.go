package allocator

import "math"

// fgdCPU is gpupool's own policy: FGD that also counts GPU share stranded
// for want of CPU. FGD sees CPU only through the task types that no longer
// fit a node; it happily puts CPU-only tasks and CPU-hungry GPU tasks on
// nodes with few cores per GPU, and those GPUs then sit idle. fgdCPU adds
// to a node's fragmentation the free GPU share its free CPU cannot feed at
// the workload's mean CPU per GPU share, so such tasks go where cores are
// plentiful. Growth is rounded to growthStep so that near-equal nodes tie
// and ties go to the same nodes (packing), as they do for FGD.
type fgdCPU struct {
	ties *tieBreaker
	frag fragMemo
}

// growthStep is the resolution, in milli-GPU, below which two placements
// count as equally good.
const growthStep = 20

func newFGDCPU(o PolicyOptions) Policy {
	w, cpuPerMilli := o.Workload, o.Workload.CPUPerMilli()
	measure := func(n *Node) float64 {
		return w.Fragmentation(n) + strandedByCPU(n, cpuPerMilli)
	}
	return &fgdCPU{ties: newTieBreaker(o.Seed), frag: fragMemo{measure: measure}}
}

func (*fgdCPU) Name() string { return "fgd-cpu" }

func (p *fgdCPU) Place(c *Cluster, d *Demand) (Placement, bool) {
	return p.ties.pick(c, d, func(i int, n *Node, d *Demand) (int64, gpuMask) {
		before := p.frag.of(i, n)
		growth, gpus := leastGrowth(n, d, p.frag.measure, func(after float64) float64 { return after - before })
		return -int64(math.Round(growth / growthStep)), gpus
	})
}

// strandedByCPU is the free GPU share of n that its free CPU cannot feed
// when tasks use cpuPerMilli CPU per milli-GPU.
func strandedByCPU(n *Node, cpuPerMilli float64) float64 {
	if n.CPUCap == 0 || cpuPerMilli == 0 {
		return 0
	}
	return math.Max(0, float64(n.FreeMilli())-float64(n.CPUFree)/cpuPerMilli)
}

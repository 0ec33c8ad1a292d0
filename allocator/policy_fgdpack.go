package allocator

// fgdPack is FGD with exact fragmentation growth: no sigmoid, no integer
// rounding that turns near-equal nodes into a coin toss.
type fgdPack struct {
	ties *tieBreaker
	frag fragMemo
}

func newFGDPack(o PolicyOptions) Policy {
	return &fgdPack{ties: newTieBreaker(o.Seed), frag: fragMemo{work: o.Workload}}
}

func (*fgdPack) Name() string { return "fgd-pack" }

func (p *fgdPack) Place(c *Cluster, d *Demand) (Placement, bool) {
	return p.ties.pick(c, d, func(i int, n *Node, d *Demand) (int64, gpuMask) {
		before := p.frag.of(i, n)
		growth, gpus := leastGrowth(n, d, p.frag.work, func(after float64) float64 { return after - before })
		return -int64(growth * 1000), gpus
	})
}

package allocator

import "math/rand/v2"

// fitPolicy scores a node by what it keeps free after a placement, as the
// FGD paper's BestFit baseline does: half CPU, half GPU share, each scaled
// by the largest node.
//
// best-fit (pack) prefers the node left with the least and the tightest
// GPUs there; spread prefers the most and the loosest GPUs, spreading load
// for headroom and thermal balance at the cost of fragmentation.
type fitPolicy struct {
	name string
	pack bool
	ties *tieBreaker
}

func newBestFit(o PolicyOptions) Policy {
	return &fitPolicy{name: "best-fit", pack: true, ties: newTieBreaker(o.Seed)}
}

func newSpread(o PolicyOptions) Policy {
	return &fitPolicy{name: "spread", pack: false, ties: newTieBreaker(o.Seed)}
}

func (p *fitPolicy) Name() string { return p.name }

func (p *fitPolicy) Place(c *Cluster, d *Demand) (Placement, bool) {
	return p.ties.pick(c, d, func(_ int, n *Node, d *Demand) (int64, gpuMask) {
		left := leftover(c, n, d)
		if p.pack {
			return int64(100 * (1 - left)), tightestGPUs(n, d)
		}
		return int64(100 * left), loosestGPUs(n, d)
	})
}

// leftover is what n keeps free after d, from 0 to 1: half CPU, half GPU
// share, each scaled by the largest node of the cluster.
func leftover(c *Cluster, n *Node, d *Demand) float64 {
	var cpu float64
	if n.CPUCap > 0 && c.maxCPU > 0 {
		cpu = float64(n.CPUFree-d.CPUMilli) / float64(c.maxCPU)
	}
	var asked Share
	if d.GPUs > 0 {
		asked = Share(d.GPUs) * d.share(&n.GPUs[0])
	}
	gpu := float64(n.FreeShare()-asked) / float64(c.maxShare)
	return 0.5*cpu + 0.5*gpu
}

// random places on a uniformly chosen node that fits, on GPUs chosen
// uniformly among those that fit: the baseline every policy must beat.
type random struct {
	rng *rand.Rand
}

func newRandom(o PolicyOptions) Policy { return &random{rng: newRand(o.Seed)} }

func (*random) Name() string { return "random" }

func (p *random) Place(c *Cluster, d *Demand) (Placement, bool) {
	var where Placement
	fits := 0
	for i := range c.Nodes {
		if d.Nodes.allows(i) && c.Nodes[i].Fits(d) {
			fits++
			if p.rng.IntN(fits) == 0 {
				where.Node = i
			}
		}
	}
	if fits == 0 || d.GPUs == 0 {
		return where, fits > 0
	}
	n := &c.Nodes[where.Node]
	var buf [MaxGPUsPerServer]int
	usable := n.rankUsable(d, nil, &buf)
	p.rng.Shuffle(len(usable), func(i, j int) { usable[i], usable[j] = usable[j], usable[i] })
	where.GPUs = n.takeLinked(d, usable).indices()
	return where, true
}

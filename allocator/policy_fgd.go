package allocator

import "math"

// fragPolicy places a task where a fragmentation measure of the node grows
// least; cost turns the growth (milli-GPU) into the score's unit, rounded
// to an integer so that near-equal nodes tie.
type fragPolicy struct {
	name string
	ties *tieBreaker
	frag fragMemo
	cost func(growth float64) float64
}

func (p *fragPolicy) Name() string { return p.name }

func (p *fragPolicy) Place(c *Cluster, d *Demand) (Placement, bool) {
	return p.ties.pick(c, d, func(i int, n *Node, d *Demand) (int64, gpuMask) {
		before := p.frag.of(c, i, n)
		cost, gpus := leastCost(n, d, p.frag.measure, func(after float64) float64 { return p.cost(after - before) })
		return -int64(math.Round(cost)), gpus
	})
}

// newFGD is Fragmentation Gradient Descent (Weng et al., "Beware of
// Fragmentation", USENIX ATC'23), scored as the paper's simulator does:
// 100*sigmoid(-growth/1000) truncated to an integer, the first best GPU on
// a node; ties between nodes go by the tieBreaker's seeded node order.
func newFGD(o PolicyOptions) Policy {
	return &fragPolicy{
		name: "fgd", ties: newTieBreaker(o.Seed), frag: fragMemo{measure: newFragIndex(o.Workload).fragmentation},
		cost: func(growth float64) float64 { return -float64(sigmoidScore(-growth)) },
	}
}

// sigmoidScore is the FGD simulator's node score for a fragmentation drop
// of delta milli-GPU.
func sigmoidScore(delta float64) int64 {
	return int64(100 / (1 + math.Exp(-delta/float64(WholeGPU))))
}

// leastCost tries d on n and returns the smallest cost(measure after)
// with the GPUs that give it. A single-GPU task tries every usable GPU (the
// first wins ties); a multi-GPU task takes the tightest GPUs.
func leastCost(n *Node, d *Demand, measure func(*Node) float64, cost func(after float64) float64) (float64, gpuMask) {
	n.CPUFree -= d.CPUMilli
	defer func() { n.CPUFree += d.CPUMilli }()
	if d.GPUs != 1 {
		var gpus gpuMask
		if d.GPUs > 0 {
			gpus = tightestGPUs(n, d)
		}
		shares := takeShares(n, d, gpus)
		after := measure(n)
		giveShares(n, gpus, shares)
		return cost(after), gpus
	}
	best, pick := math.Inf(1), -1
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if !d.usable(g) || sameAsEarlier(n, i) {
			continue
		}
		s := d.share(g)
		g.Free -= s
		c := cost(measure(n))
		g.Free += s
		if c < best {
			best, pick = c, i
		}
	}
	return best, 1 << pick
}

// sameAsEarlier reports whether a GPU before i is alike in all a placement
// weighs, so trying i would only repeat that GPU's outcome (which wins ties).
func sameAsEarlier(n *Node, i int) bool {
	g := &n.GPUs[i]
	for j := range i {
		h := &n.GPUs[j]
		if h.Free == g.Free && h.Model == g.Model && h.Healthy == g.Healthy && h.MemoryBytes == g.MemoryBytes {
			return true
		}
	}
	return false
}

// takeShares and giveShares apply d to n's GPUs in place while a policy
// weighs a placement; Version is left alone as the node ends unchanged.
func takeShares(n *Node, d *Demand, gpus gpuMask) [MaxGPUsPerServer]Share {
	var shares [MaxGPUsPerServer]Share
	for _, i := range gpus.indices() {
		shares[i] = d.share(&n.GPUs[i])
		n.GPUs[i].Free -= shares[i]
	}
	return shares
}

func giveShares(n *Node, gpus gpuMask, shares [MaxGPUsPerServer]Share) {
	for _, i := range gpus.indices() {
		n.GPUs[i].Free += shares[i]
	}
}

// fragMemo remembers a measure of each node of one cluster at one Scale
// for the node's current version.
type fragMemo struct {
	measure func(*Node) float64
	cluster *Cluster
	scale   uint64
	// seen holds Version+1 of the node when value was worked out; 0 is empty.
	seen  []uint64
	value []float64
}

func (m *fragMemo) of(c *Cluster, i int, n *Node) float64 {
	if m.cluster != c || m.scale != c.Scale {
		m.cluster, m.scale, m.seen, m.value = c, c.Scale, nil, nil
	}
	if i >= len(m.value) {
		m.seen = append(m.seen, make([]uint64, i+1-len(m.seen))...)
		m.value = append(m.value, make([]float64, i+1-len(m.value))...)
	}
	if m.seen[i] != n.Version+1 {
		m.seen[i], m.value[i] = n.Version+1, m.measure(n)
	}
	return m.value[i]
}

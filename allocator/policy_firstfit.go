package allocator

// firstFit takes the first node, in the pool's order, that fits a demand,
// and there the lowest-indexed GPUs that can take it: what kube-scheduler's
// DRA allocator does with the devices of the node it is asked about (in
// the order of their pools, slices and names). The pool does not place
// with it; it is the baseline replays compare the others with.
type firstFit struct{}

func newFirstFit(PolicyOptions) Policy { return firstFit{} }

func (firstFit) Name() string { return "first-fit" }

func (firstFit) Place(c *Cluster, d *Demand) (Placement, bool) {
	for i := range c.Nodes {
		if n := &c.Nodes[i]; d.Nodes.allows(i) && n.Fits(d) {
			return Placement{Node: i, GPUs: chooseGPUs(n, d, nil).indices()}, true
		}
	}
	return Placement{}, false
}

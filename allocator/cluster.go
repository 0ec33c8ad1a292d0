package allocator

import (
	"fmt"
	"math/bits"

	"github.com/gpupool/gpupool/inventory"
)

// ModelSet is a set of GPU models as a bit per model interned in a Cluster.
// The zero set means "any model".
type ModelSet uint64

// MaxGPUsPerServer bounds a server's GPUs so a set of them fits a gpuMask;
// a request's gpu-amount, all on one server, is bounded by it too.
const MaxGPUsPerServer = 64

// maxModels is how many distinct GPU models one pool can tell apart.
const maxModels = 64

func (s ModelSet) allows(m ModelSet) bool { return s == 0 || s&m != 0 }

// index is the bit number of a single model.
func (s ModelSet) index() int { return bits.TrailingZeros64(uint64(s)) }

// Cluster is the placement view of the pool: what every server and GPU has
// free. Only Pool (and the simulator) change it, through Commit and
// Uncommit, so that the invariants hold in one place; a policy may try a
// placement on a node while weighing it but leaves the node as it found it.
type Cluster struct {
	Nodes  []Node
	models []string
	modelB map[string]ModelSet
	// maxCPU and maxShare are the largest capacities any node has had,
	// the scale of the fit-based policies' scores; gpusByModel counts the
	// GPUs of each model (by bit), the supply fgd-cpu weighs
	// model-constrained demand against. Scale counts their changes so
	// that cached scores can tell they are out of date.
	maxCPU      int64
	maxShare    Share
	gpusByModel [maxModels]int
	Scale       uint64
	// changed lists the nodes whose Version moved, oldest first, after the
	// first changedBase changes (dropped to bound it), so that a policy
	// catches up with the cluster by the nodes that changed rather than by
	// looking at every node.
	changed     []int
	changedBase uint64
}

// Node is one server's free resources.
type Node struct {
	Name string
	// CPUCap and MemCap are zero when the server does not account for them.
	CPUCap, CPUFree int64
	MemCap, MemFree int64
	GPUs            []NodeGPU
	Models          ModelSet // union of the models of its GPUs
	// linked is whether the links between its GPUs differ, so that which
	// GPUs a multi-GPU demand takes matters for more than their shares.
	linked bool
	// Schedulable is false while the server has lost its heartbeat.
	Schedulable bool
	// Version changes whenever anything above changes, so policies can
	// cache what they worked out for a node.
	Version uint64
}

// NodeGPU is one GPU's free share.
type NodeGPU struct {
	Free        Share // not leased
	FreeBytes   int64 // GPU memory not leased
	MemoryBytes int64
	Model       ModelSet
	Healthy     bool
	// reach[l] is the GPUs of the node this one reaches by link l or a
	// better one, itself included; a server that does not report links
	// reaches every other GPU by LinkAny only.
	reach [inventory.LinkNVLink + 1]gpuMask
}

// Demand is a request resolved against the cluster: what one lease needs
// from a single node.
type Demand struct {
	GPUs int
	// PerGPU is the share of each GPU when asked by percent (or whole).
	// GPUBytes is the memory of each GPU when asked by memory; the share is
	// then worked out per GPU.
	PerGPU   Share
	GPUBytes int64
	CPUMilli int64
	Memory   int64
	Models   ModelSet
	// Link is the least link every pair of the demand's GPUs must have.
	Link inventory.Link
	// Nodes restricts placement to these nodes; nil allows every node.
	// It is no part of the demand's shape: a node's rating for a shape
	// holds whichever nodes a demand may go to, so policies cache ratings
	// by shape.
	Nodes *NodeSet
}

// shape is d without its node restriction.
func (d *Demand) shape() Demand {
	s := *d
	s.Nodes = nil
	return s
}

// NodeSet is a set of node indices.
type NodeSet struct {
	words []uint64
}

// add puts node i in the set.
func (s *NodeSet) add(i int) {
	for len(s.words) <= i/64 {
		s.words = append(s.words, 0)
	}
	s.words[i/64] |= 1 << (i % 64)
}

// allows reports whether node i is in the set; a nil set allows all.
func (s *NodeSet) allows(i int) bool {
	return s == nil || i/64 < len(s.words) && s.words[i/64]&(1<<(i%64)) != 0
}

// NewCluster returns an empty cluster.
func NewCluster() *Cluster {
	return &Cluster{modelB: map[string]ModelSet{}}
}

// model interns a GPU model name.
func (c *Cluster) model(name string) (ModelSet, error) {
	if b, ok := c.modelB[name]; ok {
		return b, nil
	}
	if len(c.models) == maxModels {
		return 0, &FieldError{Field: "model", Value: name, Limit: fmt.Sprintf("is one model too many: a pool tells apart at most %d", maxModels)}
	}
	b := ModelSet(1) << len(c.models)
	c.models = append(c.models, name)
	c.modelB[name] = b
	return b, nil
}

// ModelSetOf returns the set of the named models that the cluster knows,
// and whether any of them is known. Unknown names match no GPU.
func (c *Cluster) ModelSetOf(names []string) (set ModelSet, any bool) {
	for _, n := range names {
		set |= c.modelB[n]
	}
	return set, len(names) == 0 || set != 0
}

// AddNode appends a server with nothing leased and returns its index.
func (c *Cluster) AddNode(s *inventory.Server) (int, error) {
	n, err := c.newNode(s)
	if err != nil {
		return 0, err
	}
	c.Nodes = append(c.Nodes, n)
	c.rescale(nil, &n)
	c.logChange(len(c.Nodes) - 1)
	return len(c.Nodes) - 1, nil
}

// ResetNode replaces node i's resources with s's, nothing leased; the node
// keeps whether it is schedulable.
func (c *Cluster) ResetNode(i int, s *inventory.Server) error {
	n, err := c.newNode(s)
	if err != nil {
		return err
	}
	old := &c.Nodes[i]
	n.Schedulable, n.Version = old.Schedulable, old.Version
	c.rescale(old, &n)
	*old = n
	c.touch(i)
	return nil
}

func (c *Cluster) newNode(s *inventory.Server) (Node, error) {
	if len(s.GPUs) > MaxGPUsPerServer {
		return Node{}, &FieldError{Field: "gpus", Value: fmt.Sprint(len(s.GPUs)), Limit: fmt.Sprintf("out of range 0..%d per server", MaxGPUsPerServer)}
	}
	n := Node{
		Name: s.Name, CPUCap: s.CPUMilli, CPUFree: s.CPUMilli,
		MemCap: s.MemoryBytes, MemFree: s.MemoryBytes, Schedulable: true,
		GPUs: make([]NodeGPU, len(s.GPUs)),
	}
	for i := range s.GPUs {
		g := &s.GPUs[i]
		m, err := c.model(g.Model)
		if err != nil {
			return Node{}, err
		}
		n.GPUs[i] = NodeGPU{Free: WholeGPU, FreeBytes: g.MemoryBytes, MemoryBytes: g.MemoryBytes, Model: m, Healthy: g.Healthy}
		n.Models |= m
	}
	n.linked = setReach(n.GPUs, s)
	return n, nil
}

// setReach fills each node GPU's reach from the server's links and
// reports whether the links between distinct GPUs differ.
func setReach(ng []NodeGPU, s *inventory.Server) (linked bool) {
	for i := range s.GPUs {
		for j := range s.GPUs {
			l := s.LinkBetween(i, j)
			for at := inventory.LinkAny; at <= l; at++ {
				ng[i].reach[at] |= 1 << j
			}
			if i != j && l != s.LinkBetween(0, 1) {
				linked = true
			}
		}
	}
	return linked
}

// rescale accounts for node n, which replaces old (nil for a new node):
// it raises the largest capacities to cover n and counts its GPUs by model.
// Those change scores beyond any one node, so Scale moves on when they do.
func (c *Cluster) rescale(old, n *Node) {
	gpus := c.gpusByModel
	if old != nil {
		for i := range old.GPUs {
			gpus[old.GPUs[i].Model.index()]--
		}
	}
	for i := range n.GPUs {
		gpus[n.GPUs[i].Model.index()]++
	}
	cpu, share := max(c.maxCPU, n.CPUCap), max(c.maxShare, ShareGPUs(len(n.GPUs)))
	if cpu != c.maxCPU || share != c.maxShare || gpus != c.gpusByModel {
		c.maxCPU, c.maxShare, c.gpusByModel = cpu, share, gpus
		c.Scale++
	}
}

// share is what d takes of g; more than WholeGPU when it cannot fit on
// that GPU at all.
func (d *Demand) share(g *NodeGPU) Share {
	if d.GPUBytes == 0 {
		return d.PerGPU
	}
	if g.MemoryBytes <= 0 || d.GPUBytes > g.MemoryBytes {
		return WholeGPU + 1
	}
	return shareOfMemory(d.GPUBytes, g.MemoryBytes)
}

// usable reports whether g can take d's share.
func (d *Demand) usable(g *NodeGPU) bool {
	return g.Healthy && d.Models.allows(g.Model) && g.Free >= d.share(g)
}

// hostFits reports whether n has the CPU and memory d asks for.
func (n *Node) hostFits(d *Demand) bool {
	return n.Schedulable &&
		(n.CPUCap == 0 || n.CPUFree >= d.CPUMilli) &&
		(n.MemCap == 0 || n.MemFree >= d.Memory)
}

// Fits reports whether d can be placed on n.
func (n *Node) Fits(d *Demand) bool {
	if !n.hostFits(d) || !d.Models.allows(n.Models) && d.GPUs > 0 {
		return false
	}
	need := d.GPUs
	for i := range n.GPUs {
		if need == 0 {
			break
		}
		if d.usable(&n.GPUs[i]) {
			need--
		}
	}
	if need > 0 {
		return false
	}
	if d.Link == inventory.LinkAny || d.GPUs < 2 {
		return true
	}
	var buf [MaxGPUsPerServer]int
	_, ok := n.linkedSet(n.rankUsable(d, nil, &buf), d.GPUs, d.Link)
	return ok
}

// FreeShare is the GPU share n can still lease (healthy GPUs only).
func (n *Node) FreeShare() Share {
	var f Share
	for i := range n.GPUs {
		if n.GPUs[i].Healthy {
			f += n.GPUs[i].Free
		}
	}
	return f
}

// Placement is where a policy puts a demand: a node and its GPU indices.
type Placement struct {
	Node int
	GPUs []int
}

// Commit takes d's resources on the placement's node; the placement must
// come from a policy on the current state.
func (c *Cluster) Commit(p Placement, d *Demand) {
	n := &c.Nodes[p.Node]
	c.touch(p.Node)
	n.CPUFree -= d.CPUMilli
	n.MemFree -= d.Memory
	for _, gi := range p.GPUs {
		g := &n.GPUs[gi]
		s := d.share(g)
		g.Free -= s
		g.FreeBytes -= shareBytes(d, g, s)
	}
}

// hold takes (sign 1) or returns (sign -1) what a lease holds on node i.
func (c *Cluster) hold(i int, l *Lease, sign int64) {
	n := &c.Nodes[i]
	c.touch(i)
	n.CPUFree -= sign * l.CPUMilli
	n.MemFree -= sign * l.MemoryBytes
	for _, g := range l.GPUs {
		ng := &n.GPUs[g.Index]
		ng.Free -= Share(sign) * g.Share
		ng.FreeBytes -= sign * g.MemoryBytes
	}
}

// shareBytes is the GPU memory a lease holds on g: what it asked for when
// asked by memory, else its share of the GPU's memory (rounded down, so the
// bytes of a full GPU never exceed its capacity).
func shareBytes(d *Demand, g *NodeGPU, share Share) int64 {
	if d.GPUBytes > 0 {
		return d.GPUBytes
	}
	return share.ofMemory(g.MemoryBytes)
}

// SetGPUHealth marks one GPU healthy or not.
func (c *Cluster) SetGPUHealth(node, gpu int, healthy bool) {
	n := &c.Nodes[node]
	if n.GPUs[gpu].Healthy != healthy {
		n.GPUs[gpu].Healthy = healthy
		c.touch(node)
	}
}

// SetSchedulable marks a node as taking new placements or not, and reports
// whether that changed it.
func (c *Cluster) SetSchedulable(node int, ok bool) bool {
	n := &c.Nodes[node]
	if n.Schedulable == ok {
		return false
	}
	n.Schedulable = ok
	c.touch(node)
	return true
}

// touch moves node i's Version on: the caller changes the node.
func (c *Cluster) touch(i int) {
	c.Nodes[i].Version++
	c.logChange(i)
}

func (c *Cluster) logChange(i int) {
	// Past a few changes per node, catching up costs more than looking at
	// every node, so the log starts over rather than grow.
	if len(c.changed) >= 2*len(c.Nodes)+64 {
		c.changedBase += uint64(len(c.changed))
		c.changed = c.changed[:0]
	}
	c.changed = append(c.changed, i)
}

// changes counts the changes to nodes so far.
func (c *Cluster) changes() uint64 {
	return c.changedBase + uint64(len(c.changed))
}

// changedSince lists the nodes changed since changes() was since, with
// repeats; ok is false when the log no longer reaches back that far.
func (c *Cluster) changedSince(since uint64) (nodes []int, ok bool) {
	if since < c.changedBase {
		return nil, false
	}
	return c.changed[since-c.changedBase:], true
}

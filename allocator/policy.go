package allocator

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"sort"
	"strings"
)

// Policy decides where a demand goes. Place must not change the cluster:
// the caller commits the placement, so a policy can be asked "where would
// this go" without side effects. Policies are deterministic for a given
// seed and sequence of calls.
type Policy interface {
	Name() string
	Place(c *Cluster, d *Demand) (Placement, bool)
}

// PolicyOptions configures the policies that need more than a name.
type PolicyOptions struct {
	// Seed drives tie-breaking and the random policy.
	Seed uint64
	// Workload is the mix of task types the pool expects; FGD and the
	// policies built on it measure fragmentation against it.
	Workload Workload
}

// policyConstructors are the placement policies by their flag names.
var policyConstructors = map[string]func(PolicyOptions) Policy{
	"best-fit": newBestFit,
	"spread":   newSpread,
	"random":   newRandom,
	"fgd":      newFGD,
	"fgd-cpu":  newFGDCPU,
}

// PolicyNames lists the policies in a stable order.
func PolicyNames() []string {
	names := make([]string, 0, len(policyConstructors))
	for n := range policyConstructors {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// NewPolicy builds the named policy.
func NewPolicy(name string, opts PolicyOptions) (Policy, error) {
	mk, ok := policyConstructors[name]
	if !ok {
		return nil, &FieldError{"policy", name, "is not one of " + strings.Join(PolicyNames(), ", ")}
	}
	return mk(opts), nil
}

// gpuMask is a set of GPU indices on one node.
type gpuMask uint64

func (m gpuMask) indices() []int {
	out := make([]int, 0, bits.OnesCount64(uint64(m)))
	for m != 0 {
		i := bits.TrailingZeros64(uint64(m))
		out = append(out, i)
		m &^= 1 << i
	}
	return out
}

// rater scores a node that fits a demand (higher is better) and says which
// of its GPUs the demand would take.
type rater func(i int, n *Node, d *Demand) (score int64, gpus gpuMask)

// tieBreaker picks a top-rated node. Among nodes with the same score it
// takes the one that comes first in a seeded shuffle of the nodes, the way
// the FGD paper's simulator does (it gives nodes random name prefixes and
// the scheduler takes the first best): ties then go to the same nodes
// again and again, which packs, where a fresh coin toss per decision
// would spread.
//
// Raters are pure functions of a node's state, the demand and the
// cluster's Scale, so a rating is kept until the node's Version or the
// Scale changes: a decision rates afresh only the nodes that changed since
// the last demand of the same shape.
type tieBreaker struct {
	rng *rand.Rand
	// rank is each node's place in the shuffle, grown as nodes appear.
	rank  []uint32
	cache ratingCache
}

func newTieBreaker(seed uint64) *tieBreaker {
	return &tieBreaker{rng: newRand(seed)}
}

// newRand is the seeded source every policy draws from.
func newRand(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
}

// ranks returns the shuffle rank of every node of c, extending it with new
// nodes placed at random among the old.
func (t *tieBreaker) ranks(c *Cluster) []uint32 {
	for len(t.rank) < len(c.Nodes) {
		// An inside-out Fisher-Yates step: the new node takes a random
		// place and the node that had it moves to the end.
		i := len(t.rank)
		j := t.rng.IntN(i + 1)
		t.rank = append(t.rank, uint32(i))
		t.rank[i], t.rank[j] = t.rank[j], t.rank[i]
	}
	return t.rank
}

// pick rates every node that fits and returns a top-rated one.
func (t *tieBreaker) pick(c *Cluster, d *Demand, rate rater) (Placement, bool) {
	rank := t.ranks(c)
	// On a node whose every GPU is of a model d takes, d rates as the same
	// demand for any model would: such demands share that one's ratings,
	// rather than each set of models rating every node afresh. On a node
	// with none of d's models d never fits; only a node with some of them
	// needs ratings of d's own, kept when the first such node is met.
	anyModel := d.shape()
	anyModel.Models = 0
	anyModelRow := t.cache.row(c, &anyModel)
	var ownRow []rating
	best, found := int64(0), false
	var where Placement
	var gpus gpuMask
	for i := range c.Nodes {
		if !d.Nodes.allows(i) {
			continue
		}
		n, r, asked := &c.Nodes[i], &anyModelRow[i], &anyModel
		if d.Models != 0 && n.Models&^d.Models != 0 {
			if d.GPUs > 0 && n.Models&d.Models == 0 {
				continue
			}
			if ownRow == nil {
				ownRow = t.cache.row(c, d)
			}
			r, asked = &ownRow[i], d
		}
		if r.seen != n.Version+1 {
			r.seen, r.fits = n.Version+1, n.Fits(asked)
			if r.fits {
				r.score, r.gpus = rate(i, n, asked)
			}
		}
		if !r.fits {
			continue
		}
		if !found || r.score > best || r.score == best && rank[i] < rank[where.Node] {
			best, found, where.Node, gpus = r.score, true, i, r.gpus
		}
	}
	if !found {
		return Placement{}, false
	}
	where.GPUs = gpus.indices()
	return where, true
}

// rating is what a rater said of one node for one demand shape.
type rating struct {
	seen  uint64 // the node's Version+1 when rated; 0 when never
	fits  bool
	score int64
	gpus  gpuMask
}

// maxCachedDemands bounds the demand shapes a ratingCache remembers; past
// it the cache starts over, so odd shapes cannot grow it without end.
const maxCachedDemands = 512

// ratingCache keeps a row of ratings per demand shape (Demand.shape), one
// per node, for one cluster at one Scale.
type ratingCache struct {
	cluster *Cluster
	scale   uint64
	ids     map[Demand]int
	rows    [][]rating
}

func (rc *ratingCache) row(c *Cluster, d *Demand) []rating {
	if rc.cluster != c || rc.scale != c.Scale || len(rc.rows) >= maxCachedDemands {
		*rc = ratingCache{cluster: c, scale: c.Scale, ids: map[Demand]int{}}
	}
	shape := d.shape()
	id, ok := rc.ids[shape]
	if !ok {
		id = len(rc.rows)
		rc.ids[shape] = id
		rc.rows = append(rc.rows, nil)
	}
	if n := len(c.Nodes); len(rc.rows[id]) < n {
		rc.rows[id] = append(rc.rows[id], make([]rating, n-len(rc.rows[id]))...)
	}
	return rc.rows[id]
}

// tightestGPUs chooses d.GPUs usable GPUs of n, those with the least free
// share first (lowest index on ties): the best-fit choice within a node.
func tightestGPUs(n *Node, d *Demand) gpuMask {
	return chooseGPUs(n, d, func(a, b Share) bool { return a < b })
}

// loosestGPUs chooses the GPUs with the most free share first.
func loosestGPUs(n *Node, d *Demand) gpuMask {
	return chooseGPUs(n, d, func(a, b Share) bool { return a > b })
}

func chooseGPUs(n *Node, d *Demand, better func(a, b Share) bool) gpuMask {
	var buf [MaxGPUsPerServer]int
	usable := n.rankUsable(d, better, &buf)
	if len(usable) < d.GPUs {
		panic(fmt.Sprintf("allocator: node %s was rated without %d usable GPUs", n.Name, d.GPUs))
	}
	return n.takeLinked(d, usable)
}

// rankUsable lists in buf the GPUs of n that can take d's share, those
// better by their free share first (all in index order when better is
// nil), the lower index first on ties.
func (n *Node) rankUsable(d *Demand, better func(a, b Share) bool, buf *[MaxGPUsPerServer]int) []int {
	ranked := buf[:0]
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if !d.usable(g) {
			continue
		}
		// An insertion sort: n has few GPUs, and it keeps ties in order.
		k := len(ranked)
		ranked = append(ranked, i)
		for ; k > 0 && better != nil && better(g.Free, n.GPUs[ranked[k-1]].Free); k-- {
			ranked[k] = ranked[k-1]
		}
		ranked[k] = i
	}
	return ranked
}

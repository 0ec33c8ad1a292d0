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
	"best-fit":  newBestFit,
	"first-fit": newFirstFit,
	"spread":    newSpread,
	"random":    newRandom,
	"fgd":       newFGD,
	"fgd-cpu":   newFGDCPU,
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
		return nil, &FieldError{Field: "policy", Value: name, Limit: "is not one of " + strings.Join(PolicyNames(), ", ")}
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
// the last demand of the same shape, and finds the best by the tournament
// of ratingRow.
type tieBreaker struct {
	rng *rand.Rand
	// rank is each node's place in the shuffle, grown as nodes appear.
	rank    []uint32
	cache   ratingCache
	holders modelHolders
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

// pick returns a top-rated node that fits d.
func (t *tieBreaker) pick(c *Cluster, d *Demand, rate rater) (Placement, bool) {
	rank := t.ranks(c)
	anyModel := d.shape()
	anyModel.Models = 0
	anyModelRow := t.cache.row(c, &anyModel)
	if d.Models != 0 || d.Nodes != nil {
		return t.scan(c, d, rate, rank, anyModelRow)
	}
	best := anyModelRow.catchUp(c, rank, func(i int) { rateNode(&anyModelRow.ratings[i], i, &c.Nodes[i], d, rate) })
	if best < 0 {
		return Placement{}, false
	}
	return Placement{Node: int(best), GPUs: anyModelRow.ratings[best].gpus.indices()}, true
}

// scan rates every node d may go to and returns a top-rated one. Demands
// limited to some models or nodes come in many more shapes than the others
// and each shape seldom: a tournament of their own would be rebuilt more
// often than it saved a walk.
//
// On a node whose every GPU is of a model d takes, d rates as the same
// demand for any model would: such demands share that one's ratings,
// rather than each set of models rating every node afresh. On a node with
// none of d's models d never fits; only a node with some of them needs
// ratings of d's own, kept when the first such node is met.
func (t *tieBreaker) scan(c *Cluster, d *Demand, rate rater, rank []uint32, anyModelRow *ratingRow) (Placement, bool) {
	anyModel := d.shape()
	anyModel.Models = 0
	nodes, some := len(c.Nodes), d.Models != 0 && d.GPUs > 0
	var holding []int
	if some {
		holding = t.holders.of(c, d.Models)
		nodes = len(holding)
	}
	var ownRow *ratingRow
	var best *rating
	where := -1
	for k := range nodes {
		i := k
		if some {
			i = holding[k]
		}
		if !d.Nodes.allows(i) {
			continue
		}
		n, r, asked := &c.Nodes[i], &anyModelRow.ratings[i], &anyModel
		if d.Models != 0 && n.Models&^d.Models != 0 {
			if ownRow == nil {
				ownRow = t.cache.row(c, d)
			}
			r, asked = &ownRow.ratings[i], d
		}
		rateNode(r, i, n, asked, rate)
		if r.fits && (best == nil || r.score > best.score || r.score == best.score && rank[i] < rank[where]) {
			best, where = r, i
		}
	}
	if best == nil {
		return Placement{}, false
	}
	return Placement{Node: where, GPUs: best.gpus.indices()}, true
}

// modelHolders lists, per set of models, the nodes with a GPU of one of
// them: a demand for GPUs of some models fits nowhere else, and most
// nodes hold none of a few models. A node's models change only with the
// cluster's Scale (its GPUs by model change), or with new nodes.
type modelHolders struct {
	cluster *Cluster
	scale   uint64
	nodes   int
	holding map[ModelSet][]int
}

func (h *modelHolders) of(c *Cluster, models ModelSet) []int {
	if h.cluster != c || h.scale != c.Scale || h.nodes != len(c.Nodes) {
		*h = modelHolders{cluster: c, scale: c.Scale, nodes: len(c.Nodes), holding: map[ModelSet][]int{}}
	}
	holding, ok := h.holding[models]
	if !ok {
		for i := range c.Nodes {
			if c.Nodes[i].Models&models != 0 {
				holding = append(holding, i)
			}
		}
		h.holding[models] = holding
	}
	return holding
}

// rateNode brings r, node i's rating for d, up to n's Version.
func rateNode(r *rating, i int, n *Node, d *Demand, rate rater) {
	if r.seen == n.Version+1 {
		return
	}
	r.seen, r.fits = n.Version+1, n.Fits(d)
	if r.fits {
		r.score, r.gpus = rate(i, n, d)
	}
}

// rating is what a rater said of one node for one demand shape.
type rating struct {
	seen  uint64 // the node's Version+1 when rated; 0 when never
	fits  bool
	score int64
	gpus  gpuMask
}

// ratingRow is one demand shape's ratings of every node, and a tournament
// over them: top[k] is the better of top[2k] and top[2k+1], a leaf
// top[len(top)/2+i] is node i when it fits, so top[1] is the best node. A
// decision then rates the nodes changed since the last demand of the shape
// and replays their matches, rather than walk all nodes; a replay stops
// where a match's winner stays as it was.
type ratingRow struct {
	ratings []rating
	top     []contender
	// nodes is how many nodes top was built for (adding one moves the
	// ranks), synced the cluster's changes() it has caught up with.
	nodes  int
	synced uint64
	// caughtUp[i] is the catch-up that last visited node i; catchUps
	// counts them.
	caughtUp []uint64
	catchUps uint64
}

// contender is a node in the tournament with what decides its matches,
// kept in the tree so that a match reads no more than its two sides.
type contender struct {
	score int64
	rank  uint32
	node  int32 // -1: none, or a node that does not fit
}

// better is the higher score, then the earlier rank.
func better(a, b contender) contender {
	switch {
	case b.node < 0:
		return a
	case a.node < 0:
		return b
	case b.score > a.score || b.score == a.score && b.rank < a.rank:
		return b
	}
	return a
}

func (rw *ratingRow) contender(i int, rank []uint32) contender {
	if r := &rw.ratings[i]; r.fits {
		return contender{score: r.score, rank: rank[i], node: int32(i)}
	}
	return contender{node: -1}
}

// catchUp refreshes the ratings of the nodes changed since the row last
// caught up with c (all of them when the row is new, the nodes changed in
// number or the cluster's log does not reach back) and returns the best
// node, -1 when none fits.
func (rw *ratingRow) catchUp(c *Cluster, rank []uint32, refresh func(i int)) int32 {
	changed, ok := c.changedSince(rw.synced)
	rw.synced = c.changes()
	leaves := len(rw.top) / 2
	// A new row (no tree yet) is built whole, an empty cluster's too.
	if !ok || rw.top == nil || rw.nodes != len(c.Nodes) {
		rw.nodes = len(c.Nodes)
		for leaves = 1; leaves < len(c.Nodes); leaves *= 2 {
		}
		if len(rw.top) != 2*leaves {
			rw.top = make([]contender, 2*leaves)
		}
		if len(rw.caughtUp) < len(c.Nodes) {
			rw.caughtUp = make([]uint64, len(c.Nodes))
		}
		for i := range rw.top[leaves:] {
			rw.top[leaves+i] = contender{node: -1}
			if i < len(c.Nodes) {
				refresh(i)
				rw.top[leaves+i] = rw.contender(i, rank)
			}
		}
		for k := leaves - 1; k > 0; k-- {
			rw.top[k] = better(rw.top[2*k], rw.top[2*k+1])
		}
		return rw.top[1].node
	}
	// A node changed several times since the last catch-up is in changed
	// as often; its first visit brings it up to date.
	rw.catchUps++
	for _, i := range changed {
		if rw.caughtUp[i] == rw.catchUps {
			continue
		}
		rw.caughtUp[i] = rw.catchUps
		refresh(i)
		rw.top[leaves+i] = rw.contender(i, rank)
		for k := (leaves + i) / 2; k > 0; k /= 2 {
			winner := better(rw.top[2*k], rw.top[2*k+1])
			if winner == rw.top[k] {
				break
			}
			rw.top[k] = winner
		}
	}
	return rw.top[1].node
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
	rows    []*ratingRow
}

func (rc *ratingCache) row(c *Cluster, d *Demand) *ratingRow {
	if rc.cluster != c || rc.scale != c.Scale || len(rc.rows) >= maxCachedDemands {
		*rc = ratingCache{cluster: c, scale: c.Scale, ids: map[Demand]int{}}
	}
	shape := d.shape()
	id, ok := rc.ids[shape]
	if !ok {
		id = len(rc.rows)
		rc.ids[shape] = id
		rc.rows = append(rc.rows, &ratingRow{})
	}
	rw := rc.rows[id]
	if n := len(c.Nodes); len(rw.ratings) < n {
		rw.ratings = append(rw.ratings, make([]rating, n-len(rw.ratings))...)
	}
	return rw
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

package allocator

import (
	"fmt"
	"math/bits"

	"github.com/gpupool/gpupool/inventory"
)

// takeLinked chooses d.GPUs of the usable GPUs, listed best first by the
// policy's own measure. On a node whose links differ it takes the best
// linked set, at d.Link or better, that cuts the fewest links of the node
// (see linkedSet), so that a later multi-GPU lease still finds its GPUs
// well linked; elsewhere, and for a single GPU, it takes the first ones,
// as a policy did before GPUs had links.
func (n *Node) takeLinked(d *Demand, usable []int) gpuMask {
	if !n.linked || d.GPUs < 2 {
		var m gpuMask
		for _, i := range usable[:d.GPUs] {
			m |= 1 << i
		}
		return m
	}
	for at := inventory.LinkNVLink; ; at-- {
		if set, ok := n.linkedSet(usable, d.GPUs, at); ok {
			return set
		}
		if at == d.Link {
			break
		}
	}
	panic(fmt.Sprintf("allocator: node %s was rated without %d GPUs linked by %s", n.Name, d.GPUs, d.Link))
}

// linkedSet finds k of the usable GPUs, each pair linked by at or better,
// and reports whether there are such. Among those sets it takes the one
// whose GPUs and the node's GPUs left wholly free keep the most links
// among themselves, that is, the set that cuts the fewest; the earliest in
// usable wins ties. NVIDIA's device plugin (go-gpuallocator's besteffort
// policy) weighs the same thing by scoring every partition of the free
// GPUs into sets of the size asked; one set grown from each GPU is
// enough here, and keeps the choice cheap on every rating.
func (n *Node) linkedSet(usable []int, k int, at inventory.Link) (gpuMask, bool) {
	var rank [MaxGPUsPerServer]int
	var avail gpuMask
	for r, i := range usable {
		rank[i], avail = r, avail|1<<i
	}
	free := n.wholeFree()
	var best, covered gpuMask
	bestLinks := -1
	for _, seed := range usable {
		// A GPU of a set found already mostly grows that set again.
		if covered&(1<<seed) != 0 {
			continue
		}
		set, ok := n.growLinked(1<<seed, avail&n.GPUs[seed].reach[at]&^(1<<seed), k-1, at, &rank)
		if !ok {
			continue
		}
		covered |= set
		if links := n.linksWithin(set) + n.linksWithin(free&^set); links > bestLinks {
			best, bestLinks = set, links
		}
	}
	return best, bestLinks >= 0
}

// growLinked adds need GPUs of cand to set, each linked by at or better to
// every GPU already in it, the closest to the set first (by rank on ties),
// and backs off a choice that leads nowhere.
func (n *Node) growLinked(set, cand gpuMask, need int, at inventory.Link, rank *[MaxGPUsPerServer]int) (gpuMask, bool) {
	if need == 0 {
		return set, true
	}
	for bits.OnesCount64(uint64(cand)) >= need {
		j := n.closest(set, cand, rank)
		cand &^= 1 << j
		if grown, ok := n.growLinked(set|1<<j, cand&n.GPUs[j].reach[at], need-1, at, rank); ok {
			return grown, true
		}
	}
	return 0, false
}

// closest is the GPU of cand with the best links to the GPUs of set, the
// lowest rank on ties.
func (n *Node) closest(set, cand gpuMask, rank *[MaxGPUsPerServer]int) int {
	pick, pickLinks := -1, -1
	for m := cand; m != 0; m &= m - 1 {
		j := bits.TrailingZeros64(uint64(m))
		links := n.linksTo(j, set)
		if links > pickLinks || links == pickLinks && rank[j] < rank[pick] {
			pick, pickLinks = j, links
		}
	}
	return pick
}

// linksTo sums the link levels from GPU i to the other GPUs of set.
func (n *Node) linksTo(i int, set gpuMask) int {
	sum := 0
	for at := inventory.LinkAny + 1; at <= inventory.LinkNVLink; at++ {
		sum += bits.OnesCount64(uint64(n.GPUs[i].reach[at] & set &^ (1 << i)))
	}
	return sum
}

// linksWithin sums the link levels of the pairs of GPUs in set (each pair
// twice, which keeps the order of sums).
func (n *Node) linksWithin(set gpuMask) int {
	sum := 0
	for m := set; m != 0; m &= m - 1 {
		sum += n.linksTo(bits.TrailingZeros64(uint64(m)), set)
	}
	return sum
}

// wholeFree is n's healthy GPUs with nothing leased: those a multi-GPU
// lease of whole GPUs can still take.
func (n *Node) wholeFree() gpuMask {
	var m gpuMask
	for i := range n.GPUs {
		if g := &n.GPUs[i]; g.Healthy && g.Free == WholeGPU {
			m |= 1 << i
		}
	}
	return m
}

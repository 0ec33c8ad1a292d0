package simulate

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/inventory"
)

// Protocol constants of the FGD paper's experiments.
const (
	// Arrivals stop once the GPU share asked reaches 130% of capacity.
	arrivalLimitPct = 130
	// Fragmentation is measured against the task types that make up 95%
	// of the trace's tasks.
	typicalCoverage = 0.95
)

// Trace is a cluster and the pods that arrive on it.
type Trace struct {
	Servers []inventory.Server
	Pods    []Pod
	// Exclusive gives every GPU pod whole GPUs, its ask rounded up, as a
	// cluster that does not share GPUs (the device plugin's nvidia.com/gpu)
	// does. Arrival levels still count the pods' asks as they are, so that
	// both ways see the same pods arrive.
	Exclusive bool
}

// Result is what one replay of a trace with one policy and seed measured.
type Result struct {
	Policy string
	Seed   uint64
	// UnallocatedPct maps an arrival level (GPU share asked so far, in % of
	// capacity) to the GPU share left unallocated then, in % of capacity.
	UnallocatedPct map[int]float64
	// FragmentationPct maps an arrival level to the fragmented share of
	// the free GPU share, in %.
	FragmentationPct map[int]float64
	Decisions        int
	PlaceTime        time.Duration
	// MultiGPU counts the multi-GPU pods placed by the link all their
	// GPUs have on the servers' SimulatedTopology, whether placement saw
	// it or not.
	MultiGPU [inventory.LinkNVLink + 1]int
	// AtFullArrival is the cluster after the first arrival that brings the
	// GPU share asked to 100% of capacity; zero if none does.
	AtFullArrival Occupancy
}

// Occupancy is what has arrived and been placed at one moment of a replay.
type Occupancy struct {
	Arrived, Placed int // pods
	// PlacedAskPct is the GPU share the placed pods asked for, in % of
	// capacity: all they hold, unless GPUs are exclusive.
	PlacedAskPct float64
	// BusyGPUs counts the GPUs that hold any share.
	BusyGPUs int
}

// levels at which a replay reports unallocated share, and the level at
// which it reports fragmentation (FGD's Fig. 8).
var levels = []int{90, 100, 130}

const fragLevel = 90

// Replay places the trace's pods in a seeded shuffle, resampled with
// replacement until the GPU share that arrived reaches 130% of capacity;
// nothing departs. As in the paper, a pod that cannot be placed still
// counts as arrived.
func Replay(tr *Trace, policy string, seed uint64) (Result, error) {
	r, err := newReplayer(tr, policy, seed)
	if err != nil {
		return Result{}, err
	}
	rec := newRecorder(r.cluster, r.work, r.capacity)
	res := Result{Policy: policy, Seed: seed}
	for _, i := range arrivals(tr.Pods, r.capacity, seed) {
		d := &r.demands[i]
		start := time.Now()
		where, ok := r.place(d)
		res.PlaceTime += time.Since(start)
		res.Decisions++
		rec.arrived(tr.Pods[i].GPUShare(), granted(d), ok)
		if ok && d.GPUs > 1 {
			res.MultiGPU[r.linked[where.Node].LinkOf(where.GPUs)]++
		}
	}
	res.UnallocatedPct, res.FragmentationPct = rec.results()
	res.AtFullArrival = rec.full
	return res, nil
}

// Arrivals returns the pods in the order Replay with seed places them.
// Other placers (the Kubernetes scale test) take the same pods in the same
// order, to compare with PlaceInOrder.
func Arrivals(tr *Trace, seed uint64) []Pod {
	var capacity allocator.Share
	for i := range tr.Servers {
		capacity += allocator.ShareGPUs(len(tr.Servers[i].GPUs))
	}
	order := arrivals(tr.Pods, capacity, seed)
	pods := make([]Pod, len(order))
	for k, i := range order {
		pods[k] = tr.Pods[i]
	}
	return pods
}

// GPUArrivals are the pods asking for GPUs among Arrivals, up to the last
// that keeps the GPU share asked within the servers' capacity, which it
// returns too: what a Kubernetes cluster places through the pool (a pod
// asking no GPU is not the pool's).
func GPUArrivals(tr *Trace, seed uint64) ([]Pod, allocator.Share) {
	var capacity, asked allocator.Share
	for i := range tr.Servers {
		capacity += allocator.ShareGPUs(len(tr.Servers[i].GPUs))
	}
	var pods []Pod
	for _, p := range Arrivals(tr, seed) {
		if p.GPUs == 0 {
			continue
		}
		if asked+p.GPUShare() > capacity {
			break
		}
		asked += p.GPUShare()
		pods = append(pods, p)
	}
	return pods, capacity
}

// PlaceInOrder places pods on tr's servers in the order given, with the
// policy Replay would use for seed, and returns the GPU share left
// unallocated at the end, in % of capacity.
func PlaceInOrder(tr *Trace, pods []Pod, policy string, seed uint64) (float64, error) {
	return placeInOrder(tr, pods, policy, seed, false)
}

// PlaceAsLearnt is PlaceInOrder as a fresh allocator places: its policy
// knows nothing of the trace's task types and measures against what it
// granted so far (allocator.WorkloadEstimate), each grant counted as a
// lease records it.
func PlaceAsLearnt(tr *Trace, pods []Pod, policy string, seed uint64) (float64, error) {
	return placeInOrder(tr, pods, policy, seed, true)
}

func placeInOrder(tr *Trace, pods []Pod, policy string, seed uint64, learn bool) (float64, error) {
	r, err := newReplayer(tr, policy, seed)
	if err != nil {
		return 0, err
	}
	var estimate allocator.WorkloadEstimate
	if learn {
		if r.policy, err = allocator.NewPolicy(policy, allocator.PolicyOptions{Seed: seed}); err != nil {
			return 0, err
		}
	}
	allocated := allocator.Share(0)
	for i := range pods {
		d := r.demandOf(&pods[i])
		if _, ok := r.place(&d); !ok {
			continue
		}
		allocated += granted(&d)
		if learn && estimate.Add(allocator.Demand{GPUs: d.GPUs, PerGPU: d.PerGPU, CPUMilli: d.CPUMilli}) {
			if r.policy, err = allocator.NewPolicy(policy, allocator.PolicyOptions{Seed: seed, Workload: estimate.Current()}); err != nil {
				return 0, err
			}
		}
	}
	return 100 * float64(r.capacity-allocated) / float64(r.capacity), nil
}

// replayer is a trace's cluster and a policy that places on it.
type replayer struct {
	cluster   *allocator.Cluster
	exclusive bool
	capacity  allocator.Share
	demands   []allocator.Demand // tr.Pods' demands
	work      allocator.Workload
	policy    allocator.Policy
	// linked is each server with its SimulatedTopology, which the replay
	// measures placements by.
	linked []inventory.Server
}

// newReplayer builds tr's cluster and the policy, which expects the task
// types of the trace's pods, as in the paper.
func newReplayer(tr *Trace, policy string, seed uint64) (*replayer, error) {
	r := &replayer{cluster: allocator.NewCluster(), exclusive: tr.Exclusive}
	for i := range tr.Servers {
		if _, err := r.cluster.AddNode(&tr.Servers[i]); err != nil {
			return nil, fmt.Errorf("server %s: %w", tr.Servers[i].Name, err)
		}
		r.capacity += allocator.ShareGPUs(len(tr.Servers[i].GPUs))
		s := tr.Servers[i]
		s.GPUs = slices.Clone(s.GPUs)
		s.SetTopology(SimulatedTopology(&s))
		r.linked = append(r.linked, s)
	}
	if r.capacity == 0 {
		return nil, fmt.Errorf("trace has no GPUs")
	}
	r.demands = make([]allocator.Demand, len(tr.Pods))
	for i := range tr.Pods {
		r.demands[i] = r.demandOf(&tr.Pods[i])
	}
	r.work = allocator.TypicalWorkload(r.demands, typicalCoverage)
	var err error
	r.policy, err = allocator.NewPolicy(policy, allocator.PolicyOptions{Seed: seed, Workload: r.work})
	return r, err
}

// place places one demand, commits it and says where; false when nothing
// fits.
func (r *replayer) place(d *allocator.Demand) (allocator.Placement, bool) {
	where, ok := r.policy.Place(r.cluster, d)
	if ok {
		r.cluster.Commit(where, d)
	}
	return where, ok
}

// demandOf turns a pod into the allocator's demand on r's cluster.
func (r *replayer) demandOf(p *Pod) allocator.Demand {
	d := allocator.Demand{GPUs: p.GPUs, PerGPU: p.PerGPU, CPUMilli: p.CPUMilli, Memory: p.Memory}
	if r.exclusive && d.GPUs > 0 {
		d.PerGPU = allocator.WholeGPU
	}
	if len(p.Models) > 0 {
		set, known := r.cluster.ModelSetOf(p.Models)
		if !known {
			set = allocator.ModelSet(0)
			d.GPUs = math.MaxInt32 // asks for a model the cluster lacks: never fits
		}
		d.Models = set
	}
	return d
}

// granted is the GPU share a placed demand takes.
func granted(d *allocator.Demand) allocator.Share { return allocator.Share(d.GPUs) * d.PerGPU }

// arrivals is the order pods arrive in: all of them in a seeded shuffle,
// then pods drawn with replacement until the next one would take the GPU
// share asked beyond the arrival limit.
func arrivals(pods []Pod, capacity allocator.Share, seed uint64) []int {
	rng := rand.New(rand.NewPCG(seed, 0))
	order := make([]int, len(pods))
	var asked allocator.Share
	for i := range order {
		order[i] = i
		asked += pods[i].GPUShare()
	}
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	limit := capacity * arrivalLimitPct / 100
	for asked > 0 { // a trace that asks for no GPU would never get there
		i := rng.IntN(len(pods))
		if asked+pods[i].GPUShare() > limit {
			break
		}
		asked += pods[i].GPUShare()
		order = append(order, i)
	}
	return order
}

// recorder keeps, for each whole arrival level, the mean of what is
// measured after every arrival at that level, as the paper's analysis does.
type recorder struct {
	c                *allocator.Cluster
	work             allocator.Workload
	capacity         allocator.Share
	asked, allocated allocator.Share
	placedAsk        allocator.Share // asked by the pods placed
	unalloc, frag    map[int]*mean
	now, full        Occupancy // full: when asked first reached capacity
}

type mean struct{ sum, n float64 }

func newRecorder(c *allocator.Cluster, w allocator.Workload, capacity allocator.Share) *recorder {
	return &recorder{c: c, work: w, capacity: capacity, unalloc: map[int]*mean{}, frag: map[int]*mean{}}
}

// arrived records a pod that asked for share and, if placed, took took.
func (r *recorder) arrived(share, took allocator.Share, placed bool) {
	wasBelow := r.asked < r.capacity
	r.asked += share
	r.now.Arrived++
	if placed {
		r.allocated += took
		r.now.Placed++
		r.placedAsk += share
	}
	if wasBelow && r.asked >= r.capacity {
		r.full = r.now
		r.full.PlacedAskPct = 100 * float64(r.placedAsk) / float64(r.capacity)
		r.full.BusyGPUs = r.busyGPUs()
	}
	level := int(math.Round(100 * float64(r.asked) / float64(r.capacity)))
	at(r.unalloc, level).add(100 - 100*float64(r.allocated)/float64(r.capacity))
	// Fragmentation costs a pass over the cluster: only near its level.
	if level >= fragLevel-1 && level <= fragLevel+1 {
		at(r.frag, level).add(r.fragmentationPct())
	}
}

func at(ms map[int]*mean, level int) *mean {
	m, ok := ms[level]
	if !ok {
		m = &mean{}
		ms[level] = m
	}
	return m
}

// busyGPUs counts the cluster's GPUs that hold any share.
func (r *recorder) busyGPUs() int {
	busy := 0
	for i := range r.c.Nodes {
		for _, g := range r.c.Nodes[i].GPUs {
			if g.Free < allocator.WholeGPU {
				busy++
			}
		}
	}
	return busy
}

// fragmentationPct is the cluster's fragmented share of its free GPU share.
func (r *recorder) fragmentationPct() float64 {
	var frag, idle float64
	for i := range r.c.Nodes {
		n := &r.c.Nodes[i]
		frag += r.work.Fragmentation(n)
		idle += float64(n.FreeShare())
	}
	if idle == 0 {
		return 0
	}
	return 100 * frag / idle
}

func (m *mean) add(v float64) { m.sum += v; m.n++ }

// results reads each level's mean; a level no arrival landed on exactly
// (a large pod can step over it) takes its neighbours', as the paper does.
func (r *recorder) results() (unalloc, frag map[int]float64) {
	unalloc = map[int]float64{}
	for _, l := range levels {
		unalloc[l] = nearest(r.unalloc, l)
	}
	return unalloc, map[int]float64{fragLevel: nearest(r.frag, fragLevel)}
}

func nearest(ms map[int]*mean, level int) float64 {
	for _, l := range []int{level, level - 1, level + 1} {
		if m, ok := ms[l]; ok && m.n > 0 {
			return m.sum / m.n
		}
	}
	return math.NaN()
}

// Summary is a policy's results, averaged over seeds. A level the replay
// never reached (a trace too small to reach 130%) is NaN, null in JSON.
type Summary struct {
	Policy            string `json:"policy"`
	UnallocatedAt100  Value  `json:"unallocated_gpu_pct_at_100"`
	UnallocatedAt130  Value  `json:"unallocated_gpu_pct_at_130"`
	FragmentationAt90 Value  `json:"fragmentation_ratio_pct_at_90"`
	DecisionsPerSec   Value  `json:"decisions_per_second"`
	// WellLinkedPct is the share of the multi-GPU pods placed whose GPUs
	// are all linked by one PCIe switch or NVLink; OneSocketPct those
	// whose GPUs are at least on one CPU socket.
	WellLinkedPct Value `json:"multi_gpu_well_linked_pct"`
	OneSocketPct  Value `json:"multi_gpu_one_socket_pct"`
	// Result.AtFullArrival's: pods arrived and placed, GPUs holding any
	// share, and the GPU share the placed pods asked for, in % of capacity.
	PodsArrivedAt100  Value `json:"pods_arrived_at_100"`
	PodsPlacedAt100   Value `json:"pods_placed_at_100"`
	BusyGPUsAt100     Value `json:"busy_gpus_at_100"`
	PlacedAskPctAt100 Value `json:"placed_ask_pct_at_100"`
	Seeds             int   `json:"seeds"`
}

// Value is a measured number that may be missing (NaN).
type Value float64

// MarshalJSON writes a missing value as null.
func (v Value) MarshalJSON() ([]byte, error) {
	if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, float64(v), 'f', -1, 64), nil
}

// Summarize averages results per policy, in the order policies first appear.
func Summarize(results []Result) []Summary {
	var out []Summary
	idx := map[string]int{}
	for _, r := range results {
		i, ok := idx[r.Policy]
		if !ok {
			i = len(out)
			idx[r.Policy] = i
			out = append(out, Summary{Policy: r.Policy})
		}
		s := &out[i]
		s.UnallocatedAt100 += Value(r.UnallocatedPct[100])
		s.UnallocatedAt130 += Value(r.UnallocatedPct[130])
		s.FragmentationAt90 += Value(r.FragmentationPct[fragLevel])
		s.DecisionsPerSec += Value(float64(r.Decisions) / r.PlaceTime.Seconds())
		s.WellLinkedPct += Value(r.multiGPUPct(inventory.LinkPCIeSwitch))
		s.OneSocketPct += Value(r.multiGPUPct(inventory.LinkSocket))
		s.PodsArrivedAt100 += Value(r.AtFullArrival.Arrived)
		s.PodsPlacedAt100 += Value(r.AtFullArrival.Placed)
		s.BusyGPUsAt100 += Value(r.AtFullArrival.BusyGPUs)
		s.PlacedAskPctAt100 += Value(r.AtFullArrival.PlacedAskPct)
		s.Seeds++
	}
	for i := range out {
		s := &out[i]
		n := Value(s.Seeds)
		for _, v := range []*Value{&s.UnallocatedAt100, &s.UnallocatedAt130, &s.FragmentationAt90, &s.DecisionsPerSec,
			&s.WellLinkedPct, &s.OneSocketPct, &s.PodsArrivedAt100, &s.PodsPlacedAt100, &s.BusyGPUsAt100, &s.PlacedAskPctAt100} {
			*v /= n
		}
	}
	return out
}

// multiGPUPct is the share of the multi-GPU pods placed whose GPUs are
// all linked by at or better.
func (r *Result) multiGPUPct(at inventory.Link) float64 {
	placed, linked := 0, 0
	for l, n := range r.MultiGPU {
		placed += n
		if inventory.Link(l) >= at {
			linked += n
		}
	}
	return 100 * float64(linked) / float64(placed)
}

// maxSeeds bounds a seed list, so a typo such as 1-1000000 fails fast.
const maxSeeds = 10000

// ParseSeeds reads a seed list such as "42-51" or "1,5,9-11"; a seed
// listed twice is replayed once. Errors say what is wrong in the list and
// leave naming it to the caller.
func ParseSeeds(s string) ([]uint64, error) {
	var seeds []uint64
	seen := map[uint64]bool{}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.ParseUint(lo, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not a number", lo)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 64); err != nil || b < a {
				return nil, fmt.Errorf("%q is not a range low-high", part)
			}
		}
		if b-a >= maxSeeds {
			return nil, fmt.Errorf("%q has more than %d seeds", part, maxSeeds)
		}
		for k := range b - a + 1 {
			if x := a + k; !seen[x] {
				seen[x] = true
				seeds = append(seeds, x)
			}
		}
		if len(seeds) > maxSeeds {
			return nil, fmt.Errorf("more than %d seeds", maxSeeds)
		}
	}
	return seeds, nil
}

package simulate

import (
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/inventory"
)

// Variant derives a workload from a pod list: it sets the share of the GPU
// pods that name GPU models, that ask for part of one GPU and that ask for
// several GPUs, and scales the CPU of every GPU pod. A nil share and a zero
// CPUFactor leave that property as the list has it.
type Variant struct {
	ModelsPct     *float64 // GPU pods with a GPU-model constraint, in %
	FractionalPct *float64 // GPU pods asking for less than one GPU, in %
	MultiGPUPct   *float64 // GPU pods asking for more than one GPU, in %
	CPUFactor     float64  // multiplies each GPU pod's CPU
}

// minDonors is how many pods of a class a list needs for its own shapes to
// stand for the class; with fewer, the class's shapes come from the
// embedded traces.
const minDonors = 30

// variantStream keeps the derivation's random stream apart from the
// replay's (stream 0), so a variant seed equal to a replay seed draws
// nothing in common with it.
const variantStream = 0x76617269616e74 // "variant"

// maxCPUFactor bounds cpu=xF: far above it every GPU pod outgrows every server.
const maxCPUFactor = 16

// Variant's fields in --variant, in the order String writes them.
const (
	fieldModels     = "models"
	fieldFractional = "fractional"
	fieldMultiGPU   = "multi-gpu"
	fieldCPU        = "cpu"
)

// asIs is the variant that changes nothing, as String writes it.
const asIs = "as is"

// ParseVariant reads a variant such as "models=25%,fractional=60%,
// multi-gpu=3.5%,cpu=x0.5"; "" and "as is" are the list as it is. An error
// names the field, the value and the limit it broke.
func ParseVariant(s string) (Variant, error) {
	var v Variant
	if s = strings.TrimSpace(s); s == "" || s == asIs {
		return v, nil
	}
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		field, value, _ := strings.Cut(strings.TrimSpace(part), "=")
		if seen[field] {
			return Variant{}, fmt.Errorf("%s is given twice", field)
		}
		seen[field] = true
		var err error
		switch field {
		case fieldModels:
			v.ModelsPct, err = parsePct(field, value)
		case fieldFractional:
			v.FractionalPct, err = parsePct(field, value)
		case fieldMultiGPU:
			v.MultiGPUPct, err = parsePct(field, value)
		case fieldCPU:
			v.CPUFactor, err = parseFactor(value)
		default:
			return Variant{}, fmt.Errorf("%q is not a field: the fields are %s, %s, %s, %s",
				field, fieldModels, fieldFractional, fieldMultiGPU, fieldCPU)
		}
		if err != nil {
			return Variant{}, err
		}
	}
	if v.FractionalPct != nil && v.MultiGPUPct != nil && *v.FractionalPct+*v.MultiGPUPct > 100 {
		return Variant{}, &allocator.FieldError{Field: fieldFractional + "+" + fieldMultiGPU,
			Value: formatPct(*v.FractionalPct + *v.MultiGPUPct), Limit: "is more than 100% of the GPU pods"}
	}
	return v, nil
}

func parsePct(field, value string) (*float64, error) {
	num, ok := strings.CutSuffix(value, "%")
	p, err := strconv.ParseFloat(num, 64)
	switch {
	case !ok || err != nil:
		return nil, &allocator.FieldError{Field: field, Value: value, Limit: "is not a percentage such as 25%"}
	case p < 0 || p > 100 || math.IsNaN(p):
		return nil, &allocator.FieldError{Field: field, Value: value, Limit: "out of range 0%..100%"}
	}
	return &p, nil
}

func parseFactor(value string) (float64, error) {
	num, ok := strings.CutPrefix(value, "x")
	f, err := strconv.ParseFloat(num, 64)
	switch {
	case !ok || err != nil:
		return 0, &allocator.FieldError{Field: fieldCPU, Value: value, Limit: "is not a factor such as x0.5"}
	case !(f > 0 && f <= maxCPUFactor):
		return 0, &allocator.FieldError{Field: fieldCPU, Value: value, Limit: fmt.Sprintf("out of range above x0..x%d", maxCPUFactor)}
	}
	return f, nil
}

// String writes v as ParseVariant reads it; the list as it is is "as is".
func (v Variant) String() string {
	var parts []string
	for _, f := range []struct {
		name string
		pct  *float64
	}{{fieldModels, v.ModelsPct}, {fieldFractional, v.FractionalPct}, {fieldMultiGPU, v.MultiGPUPct}} {
		if f.pct != nil {
			parts = append(parts, f.name+"="+formatPct(*f.pct))
		}
	}
	if v.CPUFactor != 0 {
		parts = append(parts, fieldCPU+"=x"+strconv.FormatFloat(v.CPUFactor, 'f', -1, 64))
	}
	if len(parts) == 0 {
		return asIs
	}
	return strings.Join(parts, ",")
}

func formatPct(p float64) string { return strconv.FormatFloat(p, 'f', -1, 64) + "%" }

// podClass is what a GPU pod asks for: part of one GPU, one whole GPU, or
// several.
type podClass int

const (
	fractional podClass = iota
	whole
	multiGPU
)

func classOf(p *Pod) podClass {
	switch {
	case p.GPUs > 1:
		return multiGPU
	case p.PerGPU < allocator.WholeGPU:
		return fractional
	}
	return whole
}

// Derive returns pods changed as v says, drawn with seed; pods is left as
// it is. The steps, each only when its field is set:
//
//   - Shape: GPU pods move between the classes fractional, whole and
//     multi-GPU until each set class holds its share of the GPU pods
//     (rounded to a pod). A pod that moves keeps its name and constraint
//     and takes the CPU, memory and GPU ask of a pod drawn from its new
//     class in pods, or from the embedded traces when pods has fewer than
//     30 of that class (multigpu20 for multi-GPU, default otherwise).
//     Pods leave the shrinking classes for whole first, then whole pods
//     fill the growing ones.
//   - CPU: every GPU pod's CPU is multiplied by CPUFactor, to the
//     millicore. A pod that then outgrows every server never fits.
//   - Models: constraints are removed from, or added to, GPU pods drawn at
//     random until the share holds. An added constraint is a gpu_spec drawn
//     from the mix of the embedded gpuspec10 list, among those nodes can
//     satisfy: some server with a GPU of the spec holds the pod on its own.
//     A pod no spec can be satisfied for gets none.
//
// The seed is the derivation's own: the replay's seeds order arrivals and
// break ties, and a variant is the same pods for every one of them.
func (v Variant) Derive(pods []Pod, nodes []inventory.Server, seed uint64) ([]Pod, error) {
	out := slices.Clone(pods)
	rng := rand.New(rand.NewPCG(seed, variantStream))
	var gpuPods []int
	for i := range out {
		if out[i].GPUs > 0 {
			gpuPods = append(gpuPods, i)
		}
	}
	if v.FractionalPct != nil || v.MultiGPUPct != nil {
		if err := v.reshape(out, gpuPods, rng); err != nil {
			return nil, err
		}
	}
	if v.CPUFactor != 0 {
		for _, i := range gpuPods {
			out[i].CPUMilli = int64(math.Round(float64(out[i].CPUMilli) * v.CPUFactor))
		}
	}
	if v.ModelsPct != nil {
		if err := setModels(out, gpuPods, nodes, *v.ModelsPct, rng); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// reshape moves GPU pods between classes until the set shares hold.
func (v Variant) reshape(pods []Pod, gpuPods []int, rng *rand.Rand) error {
	members := map[podClass][]int{}
	for _, i := range gpuPods {
		members[classOf(&pods[i])] = append(members[classOf(&pods[i])], i)
	}
	target := map[podClass]int{fractional: len(members[fractional]), multiGPU: len(members[multiGPU])}
	for class, pct := range map[podClass]*float64{fractional: v.FractionalPct, multiGPU: v.MultiGPUPct} {
		if pct != nil {
			target[class] = podsOf(*pct, len(gpuPods))
		}
	}
	if target[fractional]+target[multiGPU] > len(gpuPods) {
		return fmt.Errorf("%d fractional and %d multi-GPU pods of %d GPU pods: more than all of them (the list has %d fractional, %d multi-GPU)",
			target[fractional], target[multiGPU], len(gpuPods), len(members[fractional]), len(members[multiGPU]))
	}
	donors, err := donorsOf(pods, members)
	if err != nil {
		return err
	}
	move := func(from, to podClass, n int) {
		picked, rest := pick(members[from], n, rng)
		for _, i := range picked {
			d := &donors[to][rng.IntN(len(donors[to]))]
			pods[i].CPUMilli, pods[i].Memory, pods[i].GPUs, pods[i].PerGPU = d.CPUMilli, d.Memory, d.GPUs, d.PerGPU
		}
		members[from], members[to] = rest, append(members[to], picked...)
	}
	for _, class := range []podClass{fractional, multiGPU} {
		if extra := len(members[class]) - target[class]; extra > 0 {
			move(class, whole, extra)
		}
	}
	for _, class := range []podClass{fractional, multiGPU} {
		if missing := target[class] - len(members[class]); missing > 0 {
			move(whole, class, missing)
		}
	}
	return nil
}

// podsOf is pct% of n pods, to the nearest pod.
func podsOf(pct float64, n int) int { return int(math.Round(pct * float64(n) / 100)) }

// pick draws n of idx at random, without replacement, and returns them
// and the others, both in random order.
func pick(idx []int, n int, rng *rand.Rand) (picked, rest []int) {
	shuffled := slices.Clone(idx)
	rng.Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
	return shuffled[:n], shuffled[n:]
}

// donorsOf is, per class, the pods whose shapes a pod moving into it takes:
// the list's own, or the embedded trace's when the list has too few.
func donorsOf(pods []Pod, members map[podClass][]int) (map[podClass][]Pod, error) {
	donors := map[podClass][]Pod{}
	for class, fallback := range map[podClass]string{fractional: DefaultPods, whole: DefaultPods, multiGPU: MultiGPU20Pods} {
		from := pods
		idx := members[class]
		if len(idx) < minDonors {
			var err error
			if from, err = readPods(fallback); err != nil {
				return nil, err
			}
			idx = nil
			for i := range from {
				if from[i].GPUs > 0 && classOf(&from[i]) == class {
					idx = append(idx, i)
				}
			}
		}
		for _, i := range idx {
			donors[class] = append(donors[class], from[i])
		}
	}
	return donors, nil
}

func readPods(name string) (pods []Pod, err error) {
	err = readFile(name, func(r io.Reader) error { pods, err = ReadPods(r); return err })
	return pods, err
}

// setModels removes constraints from, or adds them to, GPU pods drawn at
// random until pct% of them name GPU models.
func setModels(pods []Pod, gpuPods []int, nodes []inventory.Server, pct float64, rng *rand.Rand) error {
	var named, free []int
	for _, i := range gpuPods {
		if len(pods[i].Models) > 0 {
			named = append(named, i)
		} else {
			free = append(free, i)
		}
	}
	target := podsOf(pct, len(gpuPods))
	if extra := len(named) - target; extra > 0 {
		picked, _ := pick(named, extra, rng)
		for _, i := range picked {
			pods[i].Models = nil
		}
		return nil
	}
	mix, err := modelMix(nodes)
	if err != nil {
		return err
	}
	missing := target - len(named)
	shuffled, _ := pick(free, len(free), rng)
	for _, i := range shuffled {
		if missing == 0 {
			return nil
		}
		if models := mix.draw(&pods[i], rng); models != nil {
			pods[i].Models = models
			missing--
		}
	}
	if missing > 0 {
		return fmt.Errorf("%s=%s: %d more GPU pods should name models, but no gpu_spec of %s can be satisfied for the rest",
			fieldModels, formatPct(pct), missing, GPUSpec10Pods)
	}
	return nil
}

// specMix is the gpu_specs of a pod list, in the order of their text.
type specMix []spec

// spec is one gpu_spec: its models, how many pods name it and what the
// servers with a GPU of it can give a pod.
type spec struct {
	models []string
	pods   int
	hosts  []host
}

// host is what one server can give a pod of one spec.
type host struct {
	gpus             int
	cpuMilli, memory int64
}

func (h host) holds(p *Pod) bool {
	return p.GPUs <= h.gpus && p.CPUMilli <= h.cpuMilli && p.Memory <= h.memory
}

// modelMix reads the gpu_spec mix of the embedded gpuspec10 list, each spec
// with the distinct hosts nodes offer it.
func modelMix(nodes []inventory.Server) (specMix, error) {
	pods, err := readPods(GPUSpec10Pods)
	if err != nil {
		return nil, err
	}
	count := map[string]int{}
	for i := range pods {
		if len(pods[i].Models) > 0 && pods[i].GPUs > 0 {
			count[strings.Join(pods[i].Models, "|")]++
		}
	}
	var mix specMix
	for _, text := range slices.Sorted(maps.Keys(count)) {
		s := spec{models: strings.Split(text, "|"), pods: count[text]}
		hosts := map[host]bool{}
		for i := range nodes {
			h := host{cpuMilli: nodes[i].CPUMilli, memory: nodes[i].MemoryBytes}
			for _, g := range nodes[i].GPUs {
				if slices.Contains(s.models, g.Model) {
					h.gpus++
				}
			}
			if h.gpus > 0 && !hosts[h] {
				hosts[h] = true
				s.hosts = append(s.hosts, h)
			}
		}
		mix = append(mix, s)
	}
	return mix, nil
}

// draw picks a spec for p, weighted by how many pods name it, among those
// some host holds p for; nil when none does.
func (m specMix) draw(p *Pod, rng *rand.Rand) []string {
	var fits []int
	var upTo []int // upTo[k]: pods naming fits[0..k]
	total := 0
	for s := range m {
		if slices.ContainsFunc(m[s].hosts, func(h host) bool { return h.holds(p) }) {
			total += m[s].pods
			fits, upTo = append(fits, s), append(upTo, total)
		}
	}
	if total == 0 {
		return nil
	}
	k := rng.IntN(total)
	at, _ := slices.BinarySearch(upTo, k+1)
	return m[fits[at]].models
}

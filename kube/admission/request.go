package admission

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/inventory"
	"github.com/gpupool/gpupool/kube"
)

var (
	// bfkNames are BFK's request, which the webhook replaces with
	// bitfusion.io/gpu.
	bfkNames = []corev1.ResourceName{kube.ResourceGPUAmount, kube.ResourceGPUPercent, kube.ResourceGPUMemory}
	// names are the bitfusion.io resources a container may ask for.
	names = append([]corev1.ResourceName{kube.ResourceGPU}, bfkNames...)
)

// asked is one bitfusion.io value a container asks for, and where.
type asked struct {
	value    int64
	quantity resource.Quantity
	path     *field.Path
	// shown is the value as a refusal names it: value, or the quantity
	// as written where value saturated.
	shown any
}

// gpuContainer is the container of a pod that asks for bitfusion.io
// resources, and what it asks.
type gpuContainer struct {
	container *corev1.Container
	path      *field.Path // spec.containers[1]
	pointer   string      // the same as a JSON pointer: /spec/containers/1
	limits    *field.Path // path.resources.limits
	asked     map[corev1.ResourceName]asked
}

// findGPUContainer returns the container of pod that names a bitfusion.io
// resource, nil when none does, with what it asks; the values must be
// whole numbers, equal in requests and limits.
func findGPUContainer(pod *corev1.Pod) (*gpuContainer, field.ErrorList) {
	var found []*gpuContainer
	var errs field.ErrorList
	for _, list := range []struct {
		name       string
		containers []corev1.Container
	}{{"containers", pod.Spec.Containers}, {"initContainers", pod.Spec.InitContainers}} {
		for i := range list.containers {
			path := field.NewPath("spec", list.name).Index(i)
			gc, cerrs := readContainer(&list.containers[i], path)
			errs = append(errs, cerrs...)
			if gc != nil {
				gc.pointer = "/spec/" + list.name + "/" + strconv.Itoa(i)
				found = append(found, gc)
			}
		}
	}
	for _, other := range found[min(1, len(found)):] {
		errs = append(errs, field.Forbidden(other.path.Child("resources"), "the pool leases GPUs per pod, so one container of a pod asks for them, and "+
			found[0].path.String()+" does"))
	}
	if len(errs) > 0 || len(found) == 0 {
		return nil, errs
	}
	return found[0], nil
}

// readContainer reads the bitfusion.io values c asks for; nil when it names
// none.
func readContainer(c *corev1.Container, path *field.Path) (*gpuContainer, field.ErrorList) {
	resources := path.Child("resources")
	gc := &gpuContainer{container: c, path: path, limits: resources.Child("limits"), asked: map[corev1.ResourceName]asked{}}
	var errs field.ErrorList
	named := map[corev1.ResourceName]bool{}
	for _, list := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
		for name := range list {
			named[name] = strings.HasPrefix(string(name), kube.ResourcePrefix)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(named)) {
		if !named[name] {
			continue
		}
		limit, inLimits := c.Resources.Limits[name]
		request, inRequests := c.Resources.Requests[name]
		q, at := limit, gc.limits.Key(string(name))
		if !inLimits {
			q, at = request, resources.Child("requests").Key(string(name))
		}
		v, whole := wholeValue(q)
		switch {
		case !slices.Contains(names, name):
			errs = append(errs, field.NotSupported(at, string(name), names))
		case inLimits && inRequests && limit.Cmp(request) != 0:
			errs = append(errs, field.Invalid(resources.Child("requests").Key(string(name)), request.String(),
				"must equal "+at.String()+", "+limit.String()+" (Kubernetes does not overcommit an extended resource)"))
		case !whole:
			errs = append(errs, field.Invalid(at, q.String(), "must be a whole number"))
		default:
			var shown any = v
			if q.Cmp(*resource.NewQuantity(v, q.Format)) != 0 {
				shown = q.String()
			}
			gc.asked[name] = asked{value: v, quantity: q, path: at, shown: shown}
		}
	}
	if len(gc.asked) == 0 && len(errs) == 0 {
		return nil, nil
	}
	return gc, errs
}

// wholeValue is q as a whole number, and false when it has a fraction.
// Past int64 it saturates, so that the range checks that follow refuse it
// naming their limit (not wrapped, and not called a fraction: q.AsInt64
// fails for 1Pi, a whole number).
func wholeValue(q resource.Quantity) (int64, bool) {
	switch {
	case q.Cmp(*resource.NewQuantity(math.MaxInt64, resource.DecimalSI)) > 0:
		return math.MaxInt64, true
	case q.Cmp(*resource.NewQuantity(math.MinInt64, resource.DecimalSI)) < 0:
		return math.MinInt64, true
	}
	v := q.Value() // rounded up
	return v, q.Cmp(*resource.NewQuantity(v, q.Format)) == 0
}

// part is one part of a GPU request, as written and where.
type part struct {
	value int64 // GPUs, percent, or bytes of memory
	shown any
	path  *field.Path
}

// ask is a GPU request whose parts say where they were written, so that a
// denial names the field and the value the user wrote.
type ask struct {
	// amount is nil when the request does not say; amountAt is where it
	// belongs then.
	amount   *part
	amountAt *field.Path
	// percent and memory, either or neither, are the share of each GPU.
	percent, memory *part
	models          []string
	modelsShown     string
	modelsAt        *field.Path
	topology        string
	topologyAt      *field.Path
}

// plan is how Mutate normalises a pod.
type plan struct {
	gpu     *gpuContainer
	request kube.Request
	units   int64
}

// plan reads what pod asks for: nil when it asks for no bitfusion.io
// resource.
func (c Config) plan(pod *corev1.Pod) (*plan, field.ErrorList) {
	gc, errs := findGPUContainer(pod)
	if gc == nil {
		return nil, errs
	}
	a, errs := c.containerAsk(gc)
	if errs = append(append(checkNodeName(pod), checkAnnotations(pod)...), errs...); len(errs) > 0 {
		return nil, errs
	}
	if models, ok := pod.Annotations[kube.AnnotationModels]; ok {
		a.models, a.modelsShown, a.modelsAt = strings.Split(models, ","), models, atModels
		for i, m := range a.models {
			a.models[i] = strings.TrimSpace(m)
		}
	}
	a.topology, a.topologyAt = pod.Annotations[kube.AnnotationTopology], atTopology
	if a.topology == "" && a.amount != nil && a.amount.value > 1 && c.DefaultTopology != inventory.LinkAny.String() {
		a.topology = c.DefaultTopology
	}
	units, errs := c.units(a)
	if len(errs) > 0 {
		return nil, errs
	}
	r := kube.Request{GPUAmount: int(a.amount.value), Models: a.models, Topology: a.topology}
	if a.percent != nil {
		r.GPUPercent = int(a.percent.value)
	}
	if a.memory != nil {
		format := resource.BinarySI // slices of a unit of memory
		if asked, ok := gc.asked[kube.ResourceGPUMemory]; ok {
			format = asked.quantity.Format
		}
		r.GPUMemory = resource.NewQuantity(a.memory.value, format).String()
	}
	return &plan{gpu: gc, request: r, units: units}, nil
}

// containerAsk is the request gc states: BFK's amount with a percent or a
// memory, or bitfusion.io/gpu in the cluster's unit, not both.
func (c Config) containerAsk(gc *gpuContainer) (ask, field.ErrorList) {
	gpu, direct := gc.asked[kube.ResourceGPU]
	a := ask{amountAt: gc.limits.Key(kube.ResourceGPUAmount)}
	var errs field.ErrorList
	for _, name := range bfkNames {
		v, ok := gc.asked[name]
		if !ok {
			continue
		}
		if direct {
			errs = append(errs, field.Invalid(v.path, v.value, "cannot be combined with "+gpu.path.String()+": ask in one form or the other"))
			continue
		}
		p := &part{value: v.value, shown: v.shown, path: v.path}
		switch name {
		case kube.ResourceGPUAmount:
			a.amount = p
		case kube.ResourceGPUPercent:
			a.percent = p
		case kube.ResourceGPUMemory:
			// Shown as written: 8000 (megabytes), or the quantity (16Gi).
			if p.value = megabytesOrBytes(v.value); v.value >= megabytesBelow {
				p.shown = v.quantity.String()
			}
			// Bounded here, whatever the unit: the arithmetic that
			// follows multiplies it.
			if p.value > allocator.MaxGPUMemoryBytes {
				errs = append(errs, field.Invalid(p.path, p.shown, fmt.Sprintf("must be 1..%s of each GPU's memory (a number below %d is megabytes, as in BFK)",
					resource.NewQuantity(allocator.MaxGPUMemoryBytes, resource.BinarySI), megabytesBelow)))
				continue
			}
			a.memory = p
		}
	}
	if !direct || len(errs) > 0 {
		return a, errs
	}
	n := gpu.value
	a.amount = &part{value: n, shown: gpu.shown, path: gpu.path}
	if c.Unit == kube.UnitGPUs {
		return a, nil
	}
	if m := c.Unit.MemoryBytes(); m > 0 {
		if most := allocator.MaxGPUMemoryBytes / m; n < 1 || n > most {
			return a, field.ErrorList{field.Invalid(gpu.path, gpu.shown, fmt.Sprintf("must be 1..%d (slices of %s of one GPU's memory, as this cluster counts %s)",
				most, resource.NewQuantity(m, resource.BinarySI), kube.ResourceGPU))}
		}
		a.amount.value, a.memory = 1, &part{value: n, shown: gpu.shown, path: gpu.path}
		a.memory.value, errs = times(a.memory, n, m)
		return a, errs
	}
	// In percent, up to 100 is a share of one GPU, and above it only whole
	// GPUs can be told apart from a share of several.
	switch {
	case n < 1 || n > 100 && (n%100 != 0 || n > 100*allocator.MaxGPUsPerServer):
		return a, field.ErrorList{field.Invalid(gpu.path, gpu.shown, fmt.Sprintf("must be 1..100 (percent of one GPU) or a multiple of 100 up to %d "+
			"(whole GPUs, all on one server), as this cluster counts bitfusion.io/gpu in percent of a GPU; for a share of each of several GPUs, "+
			"ask for %s and %s", 100*allocator.MaxGPUsPerServer, kube.ResourceGPUAmount, kube.ResourceGPUPercent))}
	case n < 100:
		a.amount.value, a.percent = 1, &part{value: n, shown: n, path: gpu.path}
	default:
		a.amount.value = n / 100
	}
	return a, nil
}

// recordedAsk is the request a pod's annotation records, its parts named
// as fields of the annotation.
func recordedAsk(r kube.Request) (ask, field.ErrorList) {
	a := ask{amount: &part{value: int64(r.GPUAmount), shown: int64(r.GPUAmount), path: atRequest.Child("gpuAmount")},
		models: r.Models, modelsShown: strings.Join(r.Models, ","), modelsAt: atRequest.Child("models"),
		topology: r.Topology, topologyAt: atRequest.Child("topology")}
	if r.GPUPercent != 0 {
		a.percent = &part{value: int64(r.GPUPercent), shown: int64(r.GPUPercent), path: atRequest.Child("gpuPercent")}
	}
	if r.GPUMemory != "" {
		at := atRequest.Child("gpuMemory")
		b, err := ParseGPUMemory(r.GPUMemory)
		if err != nil {
			return a, field.ErrorList{field.Invalid(at, r.GPUMemory, err.Error())}
		}
		a.memory = &part{value: b, shown: r.GPUMemory, path: at}
	}
	return a, nil
}

// units checks a and returns how much bitfusion.io/gpu it stands for in the
// cluster's unit: amount x percent in percent (100 without a percent),
// BFK's ceil(memory / GPU memory x amount x 100) for a memory; the amount
// in gpus, where a fraction of a GPU is refused (see the package comment);
// in a unit of memory, the memory asked over the unit's, rounded up.
func (c Config) units(a ask) (int64, field.ErrorList) {
	if a.amount == nil {
		share := a.percent
		if share == nil {
			share = a.memory
		}
		return 0, field.ErrorList{field.Required(a.amountAt, fmt.Sprintf("%s is a share of each GPU; %s says how many GPUs (1..%d)",
			share.path, kube.ResourceGPUAmount, allocator.MaxGPUsPerServer))}
	}
	var errs field.ErrorList
	if n := a.amount.value; n < 1 || n > allocator.MaxGPUsPerServer {
		errs = append(errs, field.Invalid(a.amount.path, a.amount.shown, fmt.Sprintf("must be 1..%d (GPUs, all on one server)", allocator.MaxGPUsPerServer)))
	}
	fraction := a.memory
	switch {
	case a.percent != nil && a.memory != nil:
		errs = append(errs, field.Invalid(a.memory.path, a.memory.shown, "cannot be combined with "+a.percent.path.String()+
			": ask for the share of each GPU by percent or by memory"))
	case a.percent != nil && (a.percent.value < 1 || a.percent.value > 100):
		errs = append(errs, field.Invalid(a.percent.path, a.percent.shown, "must be 1..100 (percent of each GPU)"))
	case a.percent != nil && a.percent.value < 100:
		fraction = a.percent
	case a.memory != nil && a.memory.value < 1:
		errs = append(errs, field.Invalid(a.memory.path, a.memory.shown, "must be above 0"))
	// In a unit of memory, a GPU's memory is the allocator's to check.
	case a.memory != nil && c.Unit.MemoryBytes() == 0 && a.memory.value >= c.GPUMemoryBytes:
		errs = append(errs, field.Invalid(a.memory.path, a.memory.shown, fmt.Sprintf("must be less than one GPU's memory, %s "+
			"(a number without a unit is megabytes, as in BFK); for whole GPUs ask for %s alone",
			resource.NewQuantity(c.GPUMemoryBytes, resource.DecimalSI), kube.ResourceGPUAmount)))
	}
	if c.Unit == kube.UnitGPUs && fraction != nil && len(errs) == 0 {
		errs = append(errs, field.Invalid(fraction.path, fraction.shown, "asks for a fraction of a GPU, and this cluster counts "+
			kube.ResourceGPU+" in whole GPUs (unit gpus): ask for whole GPUs"))
	}
	var fe *allocator.FieldError
	if err := allocator.ValidateModels(a.models); errors.As(err, &fe) {
		errs = append(errs, field.Invalid(a.modelsAt, a.modelsShown, fe.Error()))
	}
	if a.topology != "" {
		if _, err := inventory.ParseLink("topology", a.topology); errors.As(err, &fe) {
			errs = append(errs, field.Invalid(a.topologyAt, a.topology, fe.Limit))
		}
	}
	if len(errs) > 0 {
		return 0, errs
	}
	switch {
	case c.Unit == kube.UnitGPUs:
		return a.amount.value, nil
	case c.Unit.MemoryBytes() > 0:
		return c.memoryUnits(a)
	case a.memory != nil:
		// BFK's ceil(memory / GPU memory x amount x 100).
		b, err := times(a.memory, a.memory.value, a.amount.value, 100)
		return ceilDiv(b, c.GPUMemoryBytes), err
	case a.percent != nil:
		return times(a.percent, a.amount.value, a.percent.value)
	}
	return times(a.amount, a.amount.value, 100)
}

// memoryUnits is how many slices of GPU memory a asks, rounded up: its
// memory of each GPU (a percent of the cluster's GPU memory, or all of it
// for whole GPUs) times its GPUs.
func (c Config) memoryUnits(a ask) (int64, field.ErrorList) {
	each, at := c.GPUMemoryBytes, a.amount
	if a.memory != nil {
		each, at = a.memory.value, a.memory
	}
	if a.percent != nil {
		p, err := times(a.percent, c.GPUMemoryBytes, a.percent.value)
		if err != nil {
			return 0, err
		}
		each, at = ceilDiv(p, 100), a.percent
	}
	b, err := times(at, each, a.amount.value)
	return ceilDiv(b, c.Unit.MemoryBytes()), err
}

// times is the product of factors, all positive, or a refusal of the part
// at naming the limit: the bounds checked before keep every product
// within int64, and this keeps a bound missed from wrapping into a small
// count, a quota bypassed.
func times(at *part, factors ...int64) (int64, field.ErrorList) {
	p := uint64(1)
	for _, f := range factors {
		hi, lo := bits.Mul64(p, uint64(f))
		if f < 1 || hi != 0 || lo > math.MaxInt64 {
			return 0, field.ErrorList{field.Invalid(at.path, at.shown, fmt.Sprintf("is out of range: the request's product %v passes %d",
				factors, int64(math.MaxInt64)))}
		}
		p = lo
	}
	return int64(p), nil
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// megabytesBelow is where a gpu-memory stops being megabytes, as BFK wrote
// it, and starts being bytes: 10^6 MB is no GPU's memory.
const megabytesBelow = 1_000_000

func megabytesOrBytes(v int64) int64 {
	if v > 0 && v < megabytesBelow {
		return v * 1_000_000
	}
	return v
}

// ParseGPUMemory reads a GPU memory as bitfusion.io/gpu-memory states it: a
// quantity ("8000M", "16Gi") or, as in BFK, a number of megabytes ("8000").
func ParseGPUMemory(s string) (int64, error) {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a quantity (e.g. 8000, 8000M or 16Gi)", s)
	}
	if q.Sign() <= 0 || q.Cmp(*resource.NewQuantity(allocator.MaxGPUMemoryBytes, resource.BinarySI)) > 0 {
		return 0, fmt.Errorf("%q is out of range 1..1Pi", s)
	}
	v, whole := wholeValue(q)
	if !whole {
		return 0, fmt.Errorf("%q is not a whole number", s)
	}
	return megabytesOrBytes(v), nil
}

package allocator

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpupool/gpupool/internal/fielderr"
	"github.com/gpupool/gpupool/inventory"
)

// Request asks the pool for GPUs in the Bitfusion vocabulary. It is the
// validated, typed form of what a pod or `gpupool run` sends.
type Request struct {
	Namespace string
	// GPUs is bitfusion.io/gpu-amount: how many GPUs, all on one server.
	GPUs int
	// Percent is bitfusion.io/gpu-percent, the share of each GPU (1..100).
	// GPUMemoryBytes is bitfusion.io/gpu-memory, converted to the share of
	// the GPU the lease lands on. Neither set means whole GPUs.
	Percent        int
	GPUMemoryBytes int64
	// CPUMilli and MemoryBytes are the host resources the workload needs,
	// as a pod asks for them.
	CPUMilli    int64
	MemoryBytes int64
	// Models restricts placement to these GPU models; empty means any.
	Models []string
	// Topology is the least link each pair of the lease's GPUs must have
	// (gpupool.io/topology); LinkAny, the default, takes any GPUs. A
	// single-GPU lease has no pairs, so any topology is met.
	Topology inventory.Link
	Owner    Owner
	// Servers restricts placement to the servers of these names (the
	// nodes a Kubernetes scheduler found feasible); empty means any.
	// Names the pool does not know match nothing.
	Servers []string
	// IdempotencyKey makes a retried request return the lease the first
	// attempt granted instead of allocating twice.
	IdempotencyKey string
	// TTL is how long the lease lives without renewal; zero takes the
	// pool's default.
	TTL time.Duration
	// UntilReleased asks for a lease that never expires: it has no TTL and
	// lives until released, for holders whose end something else watches
	// (a pod's lease ends when the pod does).
	UntilReleased bool
}

// Owner identifies who holds a lease, so usage can be attributed to a pod.
type Owner struct {
	Pod    string
	UID    string
	Labels map[string]string
}

// Limits on what one request or one server may state. They keep every
// product of shares and bytes the pool computes inside int64 (a GPU's
// memory times WholeGPU), and they are far above any real machine.
const (
	// MaxGPUMemoryBytes bounds one GPU's memory and a gpu-memory request.
	MaxGPUMemoryBytes = 1 << 50 // 1Pi
	// MaxCPUMilli and MaxMemoryBytes bound a request's or a server's host
	// CPU and memory.
	MaxCPUMilli    = 1_000_000 * 1000 // one million cores
	MaxMemoryBytes = 1 << 60          // 1Ei
	// MinTTL is the shortest lease lifetime: a holder renews every third
	// of it, so anything shorter expires before its first renewal.
	MinTTL = time.Second
	// MaxServers bounds a request's candidate servers: the scheduler
	// names every feasible node, and clusters run beyond the 5,000 nodes
	// Kubernetes tests at.
	MaxServers = 100_000
)

// Validate checks each field against its limits and returns a *FieldError
// for the first one out of bounds.
func (r *Request) Validate() error {
	if err := validateNamespace(r.Namespace); err != nil {
		return err
	}
	switch {
	case r.GPUs < 1 || r.GPUs > MaxGPUsPerServer:
		// A lease is a share of GPUs; CPU and memory ride along with it,
		// so a lease of none would hold host resources outside any quota.
		return &FieldError{Field: "gpu-amount", Value: strconv.Itoa(r.GPUs), Limit: fmt.Sprintf("out of range 1..%d (GPUs of one server)", MaxGPUsPerServer)}
	case r.Percent < 0 || r.Percent > 100:
		return &FieldError{Field: "gpu-percent", Value: strconv.Itoa(r.Percent), Limit: "out of range 1..100"}
	case r.GPUMemoryBytes < 0 || r.GPUMemoryBytes > MaxGPUMemoryBytes:
		return &FieldError{Field: "gpu-memory", Value: formatBytes(r.GPUMemoryBytes), Limit: "out of range 1..1Pi"}
	case r.Percent > 0 && r.GPUMemoryBytes > 0:
		return &FieldError{Field: "gpu-memory", Value: formatBytes(r.GPUMemoryBytes), Limit: "cannot be combined with gpu-percent"}
	case r.CPUMilli < 0 || r.CPUMilli > MaxCPUMilli:
		return &FieldError{Field: "cpu", Value: strconv.FormatInt(r.CPUMilli, 10) + "m", Limit: "out of range 0..1M (cores)"}
	case r.MemoryBytes < 0 || r.MemoryBytes > MaxMemoryBytes:
		return &FieldError{Field: "memory", Value: formatBytes(r.MemoryBytes), Limit: "out of range 0..1Ei"}
	case r.TTL != 0 && r.TTL < MinTTL:
		return &FieldError{Field: "ttl", Value: r.TTL.String(), Limit: "is shorter than " + MinTTL.String() + " (0 takes the pool's default)"}
	case r.TTL != 0 && r.UntilReleased:
		return &FieldError{Field: "ttl", Value: r.TTL.String(), Limit: "cannot be combined with untilReleased (such a lease has no TTL)"}
	case r.Topology > inventory.LinkNVLink:
		return inventory.NotALink("topology", r.Topology.String())
	}
	if err := ValidateModels(r.Models); err != nil {
		return err
	}
	if err := validateNames("servers", r.Servers, MaxServers); err != nil {
		return err
	}
	return r.Owner.validate()
}

// ValidateModels checks a request's GPU models: how many, and each name's
// length. The admission webhook checks a pod's models with it, so that the
// pod is refused when it is created rather than when it is placed.
func ValidateModels(models []string) error {
	return validateNames("models", models, maxModels)
}

// validateNames bounds a list of names: at most max of them, each 1 to
// maxNameLen characters.
func validateNames(field string, names []string, max int) error {
	if len(names) > max {
		return &FieldError{Field: field, Value: strconv.Itoa(len(names)) + " " + field, Limit: fmt.Sprintf("more than %d", max)}
	}
	for _, n := range names {
		if n == "" || len(n) > maxNameLen {
			return &FieldError{Field: field, Value: fielderr.Shorten(n), Limit: fmt.Sprintf("must be 1..%d characters", maxNameLen)}
		}
	}
	return nil
}

// maxNameLen bounds names and UIDs as Kubernetes bounds object names;
// maxOwnerLabels bounds the labels a lease carries so it stays small in
// every store.
const (
	maxNameLen     = 253
	maxOwnerLabels = 64
)

// uidShape is what a pod's UID may hold: Kubernetes gives UUIDs; a lease
// outside Kubernetes names its owner with letters, digits and . _ : -.
var uidShape = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]*$`)

// validate checks a lease's owner, which the console, its CSV and the
// metrics show to the admin: a pod's name as Kubernetes allows it (a
// tenant's spreadsheet formula, a control byte or markup is no pod name).
func (o *Owner) validate() error {
	switch {
	case o.Pod != "" && len(validation.IsDNS1123Subdomain(o.Pod)) > 0:
		return &FieldError{Field: "owner.pod", Value: strconv.QuoteToASCII(fielderr.Shorten(o.Pod)),
			Limit: "is not a pod name: " + validation.IsDNS1123Subdomain(o.Pod)[0]}
	case len(o.UID) > maxNameLen:
		return &FieldError{Field: "owner.uid", Value: strconv.QuoteToASCII(fielderr.Shorten(o.UID)), Limit: fmt.Sprintf("longer than %d characters", maxNameLen)}
	case o.UID != "" && !uidShape.MatchString(o.UID):
		return &FieldError{Field: "owner.uid", Value: strconv.QuoteToASCII(fielderr.Shorten(o.UID)), Limit: "is not a pod UID: letters, digits and . _ : - only"}
	case len(o.Labels) > maxOwnerLabels:
		return &FieldError{Field: "owner.labels", Value: strconv.Itoa(len(o.Labels)) + " labels", Limit: fmt.Sprintf("more than %d", maxOwnerLabels)}
	}
	return validateLabels("owner.labels", o.Labels, true)
}

// validateLabels checks label keys as Kubernetes does (an optional DNS
// prefix and a name); values too when they are label values (a server's
// labels may carry URLs and addresses, so theirs are only bounded).
func validateLabels(field string, labels map[string]string, labelValues bool) error {
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return &FieldError{Field: field, Value: fielderr.Shorten(k), Limit: "is not a label key: " + errs[0]}
		}
		v := labels[k]
		if !labelValues {
			if len(v) > maxAnnotationLen {
				return &FieldError{Field: field + "." + fielderr.Shorten(k), Value: fielderr.Shorten(v), Limit: fmt.Sprintf("longer than %d characters", maxAnnotationLen)}
			}
			continue
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return &FieldError{Field: field + "." + fielderr.Shorten(k), Value: fielderr.Shorten(v), Limit: "is not a label value: " + errs[0]}
		}
	}
	return nil
}

// maxAnnotationLen bounds a server label's value.
const maxAnnotationLen = 1024

// validateNamespace accepts Kubernetes namespace names (DNS-1123 labels).
func validateNamespace(ns string) error {
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return &FieldError{Field: "namespace", Value: fielderr.Shorten(ns), Limit: "is not a namespace name: " + errs[0]}
	}
	return nil
}

// ParseGPUMemory reads a bitfusion.io/gpu-memory value, a Kubernetes
// quantity such as "8000M" or "16Gi", into bytes.
func ParseGPUMemory(s string) (int64, error) {
	return ParseQuantity("gpu-memory", s, 1, MaxGPUMemoryBytes, false)
}

// ParseQuantity reads a Kubernetes quantity (of thousandths when milli,
// as CPU is counted) within min..max, checked before any conversion so
// that a huge value is refused rather than wrapped.
func ParseQuantity(field, s string, min, max int64, milli bool) (int64, error) {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, &FieldError{Field: field, Value: fielderr.Shorten(s), Limit: "is not a quantity (e.g. 500m, 2, 8000M or 16Gi)"}
	}
	lo, hi := resource.NewQuantity(min, resource.BinarySI), resource.NewQuantity(max, resource.BinarySI)
	if milli {
		lo, hi = resource.NewMilliQuantity(min, resource.DecimalSI), resource.NewMilliQuantity(max, resource.DecimalSI)
	}
	if q.Cmp(*lo) < 0 || q.Cmp(*hi) > 0 {
		return 0, &FieldError{Field: field, Value: s, Limit: "out of range " + lo.String() + ".." + hi.String()}
	}
	if milli {
		return q.MilliValue(), nil
	}
	return q.Value(), nil
}

// formatBytes prints a byte count as a Kubernetes quantity when that is
// exact and short (16Gi, 8000M), else in Gi with two decimals.
func formatBytes(b int64) string {
	for _, f := range []resource.Format{resource.BinarySI, resource.DecimalSI} {
		if s := resource.NewQuantity(b, f).String(); len(s) <= 6 {
			return s
		}
	}
	return strconv.FormatFloat(float64(b)/(1<<30), 'f', 2, 64) + "Gi"
}

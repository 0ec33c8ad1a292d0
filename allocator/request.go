package allocator

import (
	"fmt"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Request asks the pool for GPUs in the Bitfusion vocabulary. It is the
// validated, typed form of what a pod or `gpupool run` sends.
type Request struct {
	Namespace string `json:"namespace"`
	// GPUs is bitfusion.io/gpu-amount: how many GPUs, all on one server.
	// Zero asks for CPU and memory only.
	GPUs int `json:"gpuAmount"`
	// Percent is bitfusion.io/gpu-percent, the share of each GPU (1..100).
	// GPUMemoryBytes is bitfusion.io/gpu-memory, converted to the share of
	// the GPU the lease lands on. Neither set means whole GPUs.
	Percent        int   `json:"gpuPercent,omitempty"`
	GPUMemoryBytes int64 `json:"gpuMemoryBytes,omitempty"`
	// CPUMilli and MemoryBytes are the host resources the workload needs,
	// as a pod asks for them.
	CPUMilli    int64 `json:"cpuMilli,omitempty"`
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	// Models restricts placement to these GPU models; empty means any.
	Models []string `json:"models,omitempty"`
	Owner  Owner    `json:"owner"`
	// IdempotencyKey makes a retried request return the lease the first
	// attempt granted instead of allocating twice.
	IdempotencyKey string `json:"idempotencyKey,omitempty"`
	// TTL is how long the lease lives without renewal; zero takes the
	// pool's default.
	TTL time.Duration `json:"ttl,omitempty"`
}

// Owner identifies who holds a lease, so usage can be attributed to a pod.
type Owner struct {
	Pod    string            `json:"pod,omitempty"`
	UID    string            `json:"uid,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
}

// Validate checks each field against its limits and returns a *FieldError
// for the first one out of bounds.
func (r *Request) Validate() error {
	if err := validateNamespace(r.Namespace); err != nil {
		return err
	}
	switch {
	case r.GPUs < 0:
		return &FieldError{"gpu-amount", strconv.Itoa(r.GPUs), "must be at least 0"}
	case r.Percent < 0 || r.Percent > 100:
		return &FieldError{"gpu-percent", strconv.Itoa(r.Percent), "out of range 1..100"}
	case r.GPUMemoryBytes < 0:
		return &FieldError{"gpu-memory", formatBytes(r.GPUMemoryBytes), "must be positive"}
	case r.Percent > 0 && r.GPUMemoryBytes > 0:
		return &FieldError{"gpu-memory", formatBytes(r.GPUMemoryBytes), "cannot be combined with gpu-percent"}
	case r.GPUs == 0 && r.Percent > 0:
		return &FieldError{"gpu-percent", strconv.Itoa(r.Percent), "needs gpu-amount of at least 1"}
	case r.GPUs == 0 && r.GPUMemoryBytes > 0:
		return &FieldError{"gpu-memory", formatBytes(r.GPUMemoryBytes), "needs gpu-amount of at least 1"}
	case r.CPUMilli < 0:
		return &FieldError{"cpu", strconv.FormatInt(r.CPUMilli, 10) + "m", "must be at least 0"}
	case r.MemoryBytes < 0:
		return &FieldError{"memory", formatBytes(r.MemoryBytes), "must be at least 0"}
	case r.TTL < 0:
		return &FieldError{"ttl", r.TTL.String(), "must be at least 0"}
	case r.GPUs == 0 && r.CPUMilli == 0 && r.MemoryBytes == 0:
		return &FieldError{"gpu-amount", "0", "asks for nothing: set gpu-amount, cpu or memory"}
	}
	if len(r.Models) > maxModels {
		return &FieldError{"models", strconv.Itoa(len(r.Models)) + " models", fmt.Sprintf("more than %d", maxModels)}
	}
	for _, m := range r.Models {
		if m == "" || len(m) > maxNameLen {
			return &FieldError{"models", shorten(m), fmt.Sprintf("must be 1..%d characters", maxNameLen)}
		}
	}
	return r.Owner.validate()
}

// Owner limits follow Kubernetes': names of at most 253 characters, label
// keys of at most 317 (prefix/name), values of at most 63, and a bound on
// the number of labels so a lease stays small in every store.
const (
	maxNameLen       = 253
	maxLabelKeyLen   = 317
	maxLabelValueLen = 63
	maxOwnerLabels   = 64
)

func (o *Owner) validate() error {
	switch {
	case len(o.Pod) > maxNameLen:
		return &FieldError{"owner.pod", shorten(o.Pod), fmt.Sprintf("longer than %d characters", maxNameLen)}
	case len(o.UID) > maxNameLen:
		return &FieldError{"owner.uid", shorten(o.UID), fmt.Sprintf("longer than %d characters", maxNameLen)}
	case len(o.Labels) > maxOwnerLabels:
		return &FieldError{"owner.labels", strconv.Itoa(len(o.Labels)) + " labels", fmt.Sprintf("more than %d", maxOwnerLabels)}
	}
	for k, v := range o.Labels {
		if k == "" || len(k) > maxLabelKeyLen {
			return &FieldError{"owner.labels", shorten(k), fmt.Sprintf("key must be 1..%d characters", maxLabelKeyLen)}
		}
		if len(v) > maxLabelValueLen {
			return &FieldError{"owner.labels." + shorten(k), shorten(v), fmt.Sprintf("value longer than %d characters", maxLabelValueLen)}
		}
	}
	return nil
}

// shorten keeps error messages readable when a value is huge.
func shorten(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// validateNamespace accepts Kubernetes namespace names (DNS-1123 labels).
func validateNamespace(ns string) error {
	const maxLen = 63
	if ns == "" || len(ns) > maxLen {
		return &FieldError{"namespace", ns, "must be 1..63 characters"}
	}
	for i := 0; i < len(ns); i++ {
		c := ns[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (c != '-' || i == 0 || i == len(ns)-1) {
			return &FieldError{"namespace", ns, "must be a DNS-1123 label (lower-case letters, digits and inner '-')"}
		}
	}
	return nil
}

// ParseGPUMemory reads a bitfusion.io/gpu-memory value, a Kubernetes
// quantity such as "8000M" or "16Gi", into bytes.
func ParseGPUMemory(s string) (int64, error) {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, &FieldError{"gpu-memory", s, "is not a quantity (want e.g. 8000M or 16Gi)"}
	}
	b, ok := q.AsInt64()
	if !ok || b <= 0 {
		return 0, &FieldError{"gpu-memory", s, "must be a positive whole number of bytes below 2^63"}
	}
	return b, nil
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

package allocator

import (
	"fmt"
	"strconv"
	"strings"
)

// FieldError rejects one field of a request: it names the field, the value
// that was given and the limit it broke, as in "gpu-percent 120 out of
// range 1..100".
type FieldError struct {
	Field string
	Value string
	Limit string
}

func (e *FieldError) Error() string {
	v := e.Value
	if v == "" {
		v = `""`
	}
	return e.Field + " " + v + " " + e.Limit
}

// QuotaExceededError says a namespace has no quota left for a request.
type QuotaExceededError struct {
	Namespace string
	Hard      Share
	InUse     Share
	Asked     Share
}

func (e *QuotaExceededError) Error() string {
	return fmt.Sprintf("namespace %s quota %s exceeded: in use %s, asked %s", e.Namespace, e.Hard, e.InUse, e.Asked)
}

// NoCapacityError says no healthy server can hold a demand right now.
type NoCapacityError struct {
	GPUs     int
	PerGPU   Share // share of each GPU; 0 when asked by memory
	GPUBytes int64
	Models   []string
	CPUMilli int64
	Memory   int64
}

func (e *NoCapacityError) Error() string {
	var b strings.Builder
	b.WriteString("no server has ")
	gpus := plural(e.GPUs, "GPU")
	switch {
	case e.GPUs == 0:
	case e.GPUBytes > 0:
		fmt.Fprintf(&b, "%s with %s of memory free", gpus, formatBytes(e.GPUBytes))
	case e.PerGPU >= WholeGPU:
		b.WriteString(plural(e.GPUs, "free GPU"))
	default:
		fmt.Fprintf(&b, "%s with %s free", gpus, e.PerGPU)
	}
	if len(e.Models) > 0 {
		b.WriteString(" of model ")
		b.WriteString(strings.Join(e.Models, "|"))
	}
	var host []string
	if e.CPUMilli > 0 {
		host = append(host, fmt.Sprintf("%dm CPU", e.CPUMilli))
	}
	if e.Memory > 0 {
		host = append(host, formatBytes(e.Memory)+" of memory")
	}
	if len(host) > 0 {
		if e.GPUs > 0 {
			b.WriteString(" and ")
		}
		b.WriteString(strings.Join(host, " and ") + " free")
	}
	return b.String()
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// LeaseNotFoundError is returned for a lease that never existed, was
// released or has expired.
type LeaseNotFoundError struct {
	ID string
}

func (e *LeaseNotFoundError) Error() string {
	return "lease " + e.ID + " not found (released, expired or never granted)"
}

// ServerNotFoundError is returned for an operation on an unknown server.
type ServerNotFoundError struct {
	Name string
}

func (e *ServerNotFoundError) Error() string {
	return "server " + e.Name + " not registered"
}

// IdempotencyConflictError is returned when an idempotency key is reused for
// a different request while its first lease is live.
type IdempotencyConflictError struct {
	Key     string
	LeaseID string
}

func (e *IdempotencyConflictError) Error() string {
	return "idempotency-key " + strconv.Quote(e.Key) + " already used by lease " + e.LeaseID + " for a different request"
}

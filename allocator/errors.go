package allocator

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gpupool/gpupool/internal/fielderr"
	"github.com/gpupool/gpupool/inventory"
)

// FieldError rejects one field of a request: it names the field, the value
// that was given and the limit it broke, as in "gpu-percent 120 out of
// range 1..100". It is package fielderr's, which package inventory shares,
// so that a bad link name is one too.
type FieldError = fielderr.Error

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
	// Link is the link the GPUs asked to have between each pair.
	Link     inventory.Link
	CPUMilli int64
	Memory   int64
	// Servers is how many servers the request restricted placement to
	// (0: any), Unregistered how many of them the pool does not know.
	Servers, Unregistered int
	// Silent is how many of the servers it could use take no new leases
	// (their heartbeat stopped), of Known: the refusal's likely cause
	// when they are many, and one no free share would explain.
	Silent, Known int
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
	if e.Link > inventory.LinkAny && e.GPUs > 1 {
		b.WriteString(" linked by " + e.Link.String())
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
	if e.Servers > 0 {
		fmt.Fprintf(&b, " among the %s asked", plural(e.Servers, "server"))
		if e.Unregistered > 0 {
			fmt.Fprintf(&b, " (%d not registered)", e.Unregistered)
		}
	}
	if e.Silent > 0 {
		fmt.Fprintf(&b, "; %d of %s silent (no heartbeat within the timeout)", e.Silent, plural(e.Known, "server"))
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

// IdempotencyConflictError is returned when an idempotency key is reused,
// while its first lease is live, for a different request or with
// candidate servers that leave out the lease's server.
type IdempotencyConflictError struct {
	Key     string
	LeaseID string
	// Server is set when the request was the same but its candidate
	// servers leave out the lease's, which is Server.
	Server string
}

func (e *IdempotencyConflictError) Error() string {
	why := "for a different request"
	if e.Server != "" {
		why = "on server " + e.Server + ", which is not among the servers asked"
	}
	return "idempotency-key " + strconv.Quote(e.Key) + " already used by lease " + e.LeaseID + " " + why
}

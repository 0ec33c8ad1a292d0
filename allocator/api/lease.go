package api

import (
	"fmt"
	"maps"
	"time"

	"github.com/gpupool/gpupool/allocator"
)

// Lease is a grant of GPU shares on one server, as the API answers it.
type Lease struct {
	ID        string `json:"id"`
	Namespace string `json:"namespace"`
	Owner     Owner  `json:"owner"`
	Server    string `json:"server"`
	// GPUs are the shares granted, one per GPU.
	GPUs        []LeaseGPU `json:"gpus,omitempty"`
	CPUMilli    int64      `json:"cpuMilli,omitempty"`
	MemoryBytes int64      `json:"memoryBytes,omitempty"`
	// IdempotencyKey is the key of the request that was granted the lease.
	IdempotencyKey string `json:"idempotencyKey,omitempty"`
	// TTL is how long a renewal extends the lease by ("30s"). A lease
	// UntilReleased has neither TTL nor ExpiresAt: it never expires.
	TTL           Duration  `json:"ttl,omitzero"`
	UntilReleased bool      `json:"untilReleased,omitempty"`
	GrantedAt     time.Time `json:"grantedAt"`
	ExpiresAt     time.Time `json:"expiresAt,omitzero"`
	// Idle is set, in GET /v1/leases, on a lease measured idle: every
	// sample under its namespace's idle policy's bar.
	Idle *LeaseIdle `json:"idle,omitempty"`
}

// LeaseIdle is how long a lease has been measured idle, and what its
// namespace's idle policy makes of it.
type LeaseIdle struct {
	// Since is when the run of idle samples began; Seconds its length.
	Since   time.Time `json:"since"`
	Seconds float64   `json:"seconds"`
	// UseBelow and Window are the policy's bar and window; Whole is
	// whether the run is the whole window, the lease idle.
	UseBelow float64  `json:"useBelow"`
	Window   Duration `json:"window"`
	Whole    bool     `json:"whole"`
	// Action is the policy's (report or reclaim); ReclaimAt, under
	// reclaim, when the lease's GPUs are due back unless it is used.
	Action    string    `json:"action"`
	ReclaimAt time.Time `json:"reclaimAt,omitzero"`
}

// LeaseGPU is a lease's share of one GPU.
type LeaseGPU struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	Model string `json:"model"`
	// Percent is the share in percent of the GPU (46.6); MemoryBytes the
	// GPU memory it stands for.
	Percent     float64 `json:"percent"`
	MemoryBytes int64   `json:"memoryBytes"`
}

// Owner identifies who holds a lease: the pod, for attribution.
type Owner struct {
	Pod    string            `json:"pod,omitempty"`
	UID    string            `json:"uid,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
}

// LeaseList is the answer to GET /v1/leases.
type LeaseList struct {
	Leases []Lease `json:"leases"`
}

// NewLease is l on the wire.
func NewLease(l allocator.Lease) Lease {
	w := Lease{
		ID: l.ID, Namespace: l.Namespace, Owner: NewOwner(l.Owner), Server: l.Server,
		CPUMilli: l.CPUMilli, MemoryBytes: l.MemoryBytes, IdempotencyKey: l.Request.IdempotencyKey,
		TTL: Duration(l.TTL), UntilReleased: l.UntilReleased(), GrantedAt: l.GrantedAt, ExpiresAt: l.ExpiresAt,
	}
	for _, g := range l.GPUs {
		w.GPUs = append(w.GPUs, LeaseGPU{Index: g.Index, UUID: g.UUID, Model: g.Model, Percent: g.Share.Percent(), MemoryBytes: g.MemoryBytes})
	}
	return w
}

// Core is the lease as the allocator holds it, without the request it
// answered, which the API does not send (its idempotency key aside).
func (l Lease) Core() allocator.Lease {
	c := allocator.Lease{
		ID: l.ID, Namespace: l.Namespace, Owner: l.Owner.Core(), Server: l.Server,
		CPUMilli: l.CPUMilli, MemoryBytes: l.MemoryBytes,
		TTL: time.Duration(l.TTL), GrantedAt: l.GrantedAt, ExpiresAt: l.ExpiresAt,
	}
	for _, g := range l.GPUs {
		c.GPUs = append(c.GPUs, allocator.LeaseGPU{Index: g.Index, UUID: g.UUID, Model: g.Model,
			Share: allocator.SharePercent(g.Percent), MemoryBytes: g.MemoryBytes})
	}
	return c
}

// CoreLeases converts a list of leases with Core.
func CoreLeases(ls []Lease) []allocator.Lease {
	out := make([]allocator.Lease, len(ls))
	for i := range ls {
		out[i] = ls[i].Core()
	}
	return out
}

// NewOwner is o on the wire.
func NewOwner(o allocator.Owner) Owner {
	return Owner{Pod: o.Pod, UID: o.UID, Labels: maps.Clone(o.Labels)}
}

// Core is the owner as the allocator holds it.
func (o Owner) Core() allocator.Owner {
	return allocator.Owner{Pod: o.Pod, UID: o.UID, Labels: maps.Clone(o.Labels)}
}

// Duration is a time.Duration as Go writes it ("30s", "1h0m0s"), the form
// requests send it in.
type Duration time.Duration

// MarshalText writes d as Go writes durations.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText reads a Go duration.
func (d *Duration) UnmarshalText(text []byte) error {
	v, err := time.ParseDuration(string(text))
	if err != nil {
		return fmt.Errorf("duration %q: %w", text, err)
	}
	*d = Duration(v)
	return nil
}

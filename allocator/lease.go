package allocator

import "time"

// Lease is a grant of GPU shares on one server to one owner until it
// expires, is renewed or is released. A lease asked for UntilReleased has
// no TTL and a zero ExpiresAt: it never expires.
type Lease struct {
	ID        string
	Namespace string
	Owner     Owner
	Server    string
	// GPUs are the shares granted, one per GPU.
	GPUs        []LeaseGPU
	CPUMilli    int64
	MemoryBytes int64
	// Request is what was asked, kept to tell a retry from a new request.
	Request   Request
	TTL       time.Duration
	GrantedAt time.Time
	ExpiresAt time.Time
}

// LeaseGPU is a lease's share of one GPU.
type LeaseGPU struct {
	Index int
	UUID  string
	Model string
	// Share is the share of the GPU; MemoryBytes the GPU memory it stands
	// for.
	Share       Share
	MemoryBytes int64
}

// Share is the GPU share the lease holds, summed over its GPUs: what it
// counts against its namespace's quota.
func (l *Lease) Share() Share {
	var s Share
	for _, g := range l.GPUs {
		s += g.Share
	}
	return s
}

// UntilReleased reports whether the lease never expires and lives until
// released.
func (l *Lease) UntilReleased() bool { return l.ExpiresAt.IsZero() }

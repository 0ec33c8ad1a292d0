package allocator

import "time"

// Lease is a grant of GPU shares on one server to one owner until it
// expires, is renewed or is released.
type Lease struct {
	ID        string `json:"id"`
	Namespace string `json:"namespace"`
	Owner     Owner  `json:"owner"`
	Server    string `json:"server"`
	// GPUs are the shares granted, one per GPU.
	GPUs        []LeaseGPU `json:"gpus,omitempty"`
	CPUMilli    int64      `json:"cpuMilli,omitempty"`
	MemoryBytes int64      `json:"memoryBytes,omitempty"`
	// Request is what was asked, kept to tell a retry from a new request.
	Request   Request       `json:"request"`
	TTL       time.Duration `json:"ttl"`
	GrantedAt time.Time     `json:"grantedAt"`
	ExpiresAt time.Time     `json:"expiresAt"`
}

// LeaseGPU is a lease's share of one GPU.
type LeaseGPU struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	Model string `json:"model"`
	// Share is the share of the GPU; MemoryBytes the GPU memory it stands
	// for.
	Share       Share `json:"milli"`
	MemoryBytes int64 `json:"memoryBytes"`
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

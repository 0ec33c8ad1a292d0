// Package inventory describes a GPU server as it registers with the pool:
// its GPUs, what each offers, and how each pair links. The telemetry
// sources (package collector, package fakegpu) and the trace simulator
// produce it, the allocator places on it; it imports neither, so that
// reading hardware never depends on placing on it.
package inventory

// Server is a GPU host as it registers with the pool.
type Server struct {
	Name   string
	Labels map[string]string
	// CPUMilli and MemoryBytes are what the host offers to the workloads
	// placed on it; zero means the host does not account for them.
	CPUMilli    int64
	MemoryBytes int64
	GPUs        []GPU
}

// GPU is one device of a server.
type GPU struct {
	Index       int
	UUID        string
	Model       string
	MemoryBytes int64
	// Healthy is false when the daemon reports the device broken or gone;
	// an unhealthy GPU keeps its leases but takes no new ones.
	Healthy bool
	// Links[j] is how this GPU reaches the server's GPU at position j
	// (itself included, as LinkNVLink); empty when the topology is not
	// known, which places as if every pair were LinkAny.
	Links []Link
}

// LinkBetween is the link from GPU i to GPU j of s: the best to itself,
// LinkAny to another when s does not report links.
func (s *Server) LinkBetween(i, j int) Link {
	switch {
	case i == j:
		return LinkNVLink
	case len(s.GPUs[i].Links) == 0:
		return LinkAny
	}
	return s.GPUs[i].Links[j]
}

// LinkOf is the link every pair of the given GPUs of s has: the worst of
// their links; LinkNVLink for fewer than two GPUs, as a GPU's link to
// itself.
func (s *Server) LinkOf(gpus []int) Link {
	worst := LinkNVLink
	for _, i := range gpus {
		for _, j := range gpus {
			worst = min(worst, s.LinkBetween(i, j))
		}
	}
	return worst
}

// SetTopology gives s's GPUs their links; t must have a row per GPU.
func (s *Server) SetTopology(t Topology) {
	for i := range s.GPUs {
		s.GPUs[i].Links = t[i]
	}
}

package allocator

import (
	"fmt"
	"strconv"

	"k8s.io/apimachinery/pkg/util/validation"
)

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

// validate checks a server as it registers: a Kubernetes object name (the
// GPU servers are the cluster's nodes), label keys, and capacities within
// the limits the pool's arithmetic holds.
func (s *Server) validate() error {
	if errs := validation.IsDNS1123Subdomain(s.Name); len(errs) > 0 {
		return &FieldError{"server.name", shorten(s.Name), "is not a node name: " + errs[0]}
	}
	if err := validateLabels("server.labels", s.Labels, false); err != nil {
		return err
	}
	return s.validateShape()
}

// validateShape checks what the pool's arithmetic relies on; a stored
// server registered before names were checked passes it, so that an
// upgraded allocator still starts (its daemon must then register under a
// valid name).
func (s *Server) validateShape() error {
	if s.Name == "" {
		return &FieldError{"server.name", "", "must not be empty"}
	}
	switch {
	case s.CPUMilli < 0 || s.CPUMilli > MaxCPUMilli:
		return &FieldError{"server.cpuMilli", strconv.FormatInt(s.CPUMilli, 10), fmt.Sprintf("out of range 0..%d", int64(MaxCPUMilli))}
	case s.MemoryBytes < 0 || s.MemoryBytes > MaxMemoryBytes:
		return &FieldError{"server.memoryBytes", strconv.FormatInt(s.MemoryBytes, 10), fmt.Sprintf("out of range 0..%d (1Ei)", int64(MaxMemoryBytes))}
	case len(s.GPUs) > MaxGPUsPerServer:
		return &FieldError{"server.gpus", strconv.Itoa(len(s.GPUs)) + " GPUs", fmt.Sprintf("out of range 0..%d per server", MaxGPUsPerServer)}
	}
	for i, g := range s.GPUs {
		field := "server.gpus[" + strconv.Itoa(i) + "]"
		switch {
		case g.Index != i:
			return &FieldError{field + ".index", strconv.Itoa(g.Index), "must equal its position " + strconv.Itoa(i)}
		case g.Model == "" || len(g.Model) > maxNameLen:
			return &FieldError{field + ".model", shorten(g.Model), fmt.Sprintf("must be 1..%d characters", maxNameLen)}
		case len(g.UUID) > maxNameLen:
			return &FieldError{field + ".uuid", shorten(g.UUID), fmt.Sprintf("longer than %d characters", maxNameLen)}
		case g.MemoryBytes < 0 || g.MemoryBytes > MaxGPUMemoryBytes:
			return &FieldError{field + ".memoryBytes", strconv.FormatInt(g.MemoryBytes, 10), fmt.Sprintf("out of range 0..%d (1Pi)", int64(MaxGPUMemoryBytes))}
		}
		if err := s.validateLinks(i, field); err != nil {
			return err
		}
	}
	return nil
}

// validateLinks checks GPU i's links: none, or one per GPU of the server,
// each a known level and the same seen from either end.
func (s *Server) validateLinks(i int, field string) error {
	links := s.GPUs[i].Links
	if len(links) == 0 {
		return nil
	}
	if len(links) != len(s.GPUs) {
		return &FieldError{field + ".links", strconv.Itoa(len(links)) + " links", fmt.Sprintf("must be empty or one per GPU (%d)", len(s.GPUs))}
	}
	for j, l := range links {
		switch {
		case l > LinkNVLink:
			return &FieldError{field + ".links[" + strconv.Itoa(j) + "]", l.String(), "is not a known link"}
		case len(s.GPUs[j].Links) != len(s.GPUs) || s.GPUs[j].Links[i] != l:
			return &FieldError{field + ".links[" + strconv.Itoa(j) + "]", l.String(), "differs from what gpus[" + strconv.Itoa(j) + "] says of this GPU"}
		}
	}
	return nil
}

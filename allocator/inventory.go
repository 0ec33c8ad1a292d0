package allocator

import (
	"fmt"
	"strconv"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpupool/gpupool/internal/fielderr"
	"github.com/gpupool/gpupool/inventory"
)

// validateServer checks a server as it registers: a Kubernetes object name
// (the GPU servers are the cluster's nodes), label keys, and capacities
// within the limits the pool's arithmetic holds.
func validateServer(s *inventory.Server) error {
	if errs := validation.IsDNS1123Subdomain(s.Name); len(errs) > 0 {
		return &FieldError{Field: "server.name", Value: fielderr.Shorten(s.Name), Limit: "is not a node name: " + errs[0]}
	}
	if err := validateLabels("server.labels", s.Labels, false); err != nil {
		return err
	}
	if err := validateShape(s); err != nil {
		return err
	}
	return validateGPUNames(s)
}

// validateGPUNames checks what a server says its GPUs are called: UUIDs
// reach NVIDIA_VISIBLE_DEVICES and a simulated GPU's file path, models the
// console and the metrics' labels. A stored server skips it, as its name.
func validateGPUNames(s *inventory.Server) error {
	seen := make(map[string]int, len(s.GPUs))
	for i, g := range s.GPUs {
		field := "server.gpus[" + strconv.Itoa(i) + "]"
		if err := inventory.ValidateUUID(field+".uuid", g.UUID); err != nil {
			return err
		}
		if err := inventory.ValidateModel(field+".model", g.Model); err != nil {
			return err
		}
		if j, dup := seen[g.UUID]; dup {
			return &FieldError{Field: field + ".uuid", Value: g.UUID, Limit: "is gpus[" + strconv.Itoa(j) + "]'s too: a GPU's UUID is its own"}
		}
		seen[g.UUID] = i
	}
	return nil
}

// validateShape checks what the pool's arithmetic relies on; a stored
// server registered before names were checked passes it, so that an
// upgraded allocator still starts (its daemon must then register under a
// valid name).
func validateShape(s *inventory.Server) error {
	if s.Name == "" {
		return &FieldError{Field: "server.name", Value: "", Limit: "must not be empty"}
	}
	switch {
	case s.CPUMilli < 0 || s.CPUMilli > MaxCPUMilli:
		return &FieldError{Field: "server.cpuMilli", Value: strconv.FormatInt(s.CPUMilli, 10), Limit: fmt.Sprintf("out of range 0..%d", int64(MaxCPUMilli))}
	case s.MemoryBytes < 0 || s.MemoryBytes > MaxMemoryBytes:
		return &FieldError{Field: "server.memoryBytes", Value: strconv.FormatInt(s.MemoryBytes, 10), Limit: fmt.Sprintf("out of range 0..%d (1Ei)", int64(MaxMemoryBytes))}
	case len(s.GPUs) > MaxGPUsPerServer:
		return &FieldError{Field: "server.gpus", Value: strconv.Itoa(len(s.GPUs)) + " GPUs", Limit: fmt.Sprintf("out of range 0..%d per server", MaxGPUsPerServer)}
	}
	for i, g := range s.GPUs {
		field := "server.gpus[" + strconv.Itoa(i) + "]"
		switch {
		case g.Index != i:
			return &FieldError{Field: field + ".index", Value: strconv.Itoa(g.Index), Limit: "must equal its position " + strconv.Itoa(i)}
		case g.Model == "" || len(g.Model) > maxNameLen:
			return &FieldError{Field: field + ".model", Value: fielderr.Shorten(g.Model), Limit: fmt.Sprintf("must be 1..%d characters", maxNameLen)}
		case len(g.UUID) > maxNameLen:
			return &FieldError{Field: field + ".uuid", Value: fielderr.Shorten(g.UUID), Limit: fmt.Sprintf("longer than %d characters", maxNameLen)}
		case g.MemoryBytes < 0 || g.MemoryBytes > MaxGPUMemoryBytes:
			return &FieldError{Field: field + ".memoryBytes", Value: strconv.FormatInt(g.MemoryBytes, 10), Limit: fmt.Sprintf("out of range 0..%d (1Pi)", int64(MaxGPUMemoryBytes))}
		}
		if err := validateLinks(s, i, field); err != nil {
			return err
		}
	}
	return nil
}

// validateLinks checks GPU i's links: none, or one per GPU of the server,
// each a known level and the same seen from either end.
func validateLinks(s *inventory.Server, i int, field string) error {
	links := s.GPUs[i].Links
	if len(links) == 0 {
		return nil
	}
	if len(links) != len(s.GPUs) {
		return &FieldError{Field: field + ".links", Value: strconv.Itoa(len(links)) + " links", Limit: fmt.Sprintf("must be empty or one per GPU (%d)", len(s.GPUs))}
	}
	for j, l := range links {
		switch {
		case l > inventory.LinkNVLink:
			return &FieldError{Field: field + ".links[" + strconv.Itoa(j) + "]", Value: l.String(), Limit: "is not a known link"}
		case len(s.GPUs[j].Links) != len(s.GPUs) || s.GPUs[j].Links[i] != l:
			return &FieldError{Field: field + ".links[" + strconv.Itoa(j) + "]", Value: l.String(), Limit: "differs from what gpus[" + strconv.Itoa(j) + "] says of this GPU"}
		}
	}
	return nil
}

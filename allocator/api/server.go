package api

import (
	"maps"

	"github.com/gpupool/gpupool/inventory"
)

// Server is a GPU host as it registers (PUT /v1/servers/{name}).
type Server struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
	// CPUMilli and MemoryBytes are what the host offers to the workloads
	// placed on it; zero means the host does not account for them.
	CPUMilli    int64 `json:"cpuMilli,omitempty"`
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	GPUs        []GPU `json:"gpus"`
}

// GPU is one device of a server.
type GPU struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Model       string `json:"model"`
	MemoryBytes int64  `json:"memoryBytes"`
	Healthy     bool   `json:"healthy"`
	// Links[j] is how this GPU reaches gpus[j]: any, socket, pcie-switch
	// or nvlink; absent when the daemon does not know.
	Links []inventory.Link `json:"links,omitempty"`
}

// NewServer is s on the wire.
func NewServer(s inventory.Server) Server {
	w := Server{Name: s.Name, Labels: maps.Clone(s.Labels), CPUMilli: s.CPUMilli, MemoryBytes: s.MemoryBytes, GPUs: []GPU{}}
	for _, g := range s.GPUs {
		w.GPUs = append(w.GPUs, GPU(g))
	}
	return w
}

// Core is the server as the allocator holds it.
func (s Server) Core() inventory.Server {
	c := inventory.Server{Name: s.Name, Labels: maps.Clone(s.Labels), CPUMilli: s.CPUMilli, MemoryBytes: s.MemoryBytes}
	for _, g := range s.GPUs {
		c.GPUs = append(c.GPUs, inventory.GPU(g))
	}
	return c
}

// Package gpuaccess is what a container holding a lease gets, whichever
// way the kubelet asks for it (the device plugin's Allocate, the DRA
// kubelet plugin's CDI spec): the lease's environment, the host's MPS, and
// on a node of simulated GPUs the files that stand for them.
package gpuaccess

import (
	"fmt"
	"path"
	"path/filepath"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/inventory"
	"github.com/gpupool/gpupool/kube"
)

// MPS is where the host's MPS control daemon is, for containers to reach
// it; empty fields mount nothing.
type MPS struct {
	// PipeDir is the daemon's CUDA_MPS_PIPE_DIRECTORY on the host, mounted
	// at the same path in every container and named in its environment.
	PipeDir string
	// ShmDir is the host directory the daemon's shared memory lives in,
	// mounted as the container's /dev/shm: MPS clients share it with the
	// server.
	ShmDir string
}

// Node is what a node gives every container that holds a lease.
type Node struct {
	MPS MPS
	// SimulatedDeviceDir, on a node whose GPUs are simulated, holds a file
	// per GPU named by its UUID.
	SimulatedDeviceDir string
}

// Mount is a host path in the container.
type Mount struct {
	HostPath, ContainerPath string
	ReadOnly                bool
}

// Access is what a container gets.
type Access struct {
	Env    map[string]string
	Mounts []Mount
}

// For is what a container holding lease l gets on node n: the lease's
// environment (api.LeaseEnv: its GPUs' UUIDs in NVIDIA_VISIBLE_DEVICES,
// which NVIDIA's container runtime mounts, the GPUPOOL_* variables, MPS's
// limits for a fraction) and the host's MPS; on a node whose GPUs are
// simulated, the files that stand for the lease's GPUs, each at
// kube.SimulatedDeviceDir/<UUID>. A UUID not of NVML's shapes is refused:
// the allocator checks them as servers register, but a server stored
// before that check, or a forged allocator answer, must not list other
// devices or mount a host path outside the directory.
func For(l api.Lease, n Node) (Access, error) {
	for i, g := range l.GPUs {
		if err := inventory.ValidateUUID(fmt.Sprintf("lease %s gpus[%d].uuid", l.ID, i), g.UUID); err != nil {
			return Access{}, err
		}
	}
	a := Access{Env: api.LeaseEnv(l.Core())}
	if n.SimulatedDeviceDir != "" {
		for _, g := range l.GPUs {
			// ValidateUUID leaves no ".." element; this says so again
			// where a host path is made.
			if !filepath.IsLocal(g.UUID) {
				return Access{}, fmt.Errorf("lease %s: GPU UUID %q would leave %s", l.ID, g.UUID, n.SimulatedDeviceDir)
			}
			a.Mounts = append(a.Mounts, Mount{ContainerPath: path.Join(kube.SimulatedDeviceDir, g.UUID),
				HostPath: filepath.Join(n.SimulatedDeviceDir, g.UUID), ReadOnly: true})
		}
	}
	if n.MPS.PipeDir != "" {
		a.Env["CUDA_MPS_PIPE_DIRECTORY"] = n.MPS.PipeDir
		a.Mounts = append(a.Mounts, Mount{ContainerPath: n.MPS.PipeDir, HostPath: n.MPS.PipeDir})
	}
	if n.MPS.ShmDir != "" {
		a.Mounts = append(a.Mounts, Mount{ContainerPath: "/dev/shm", HostPath: n.MPS.ShmDir})
	}
	return a, nil
}

package allocator

// MilliPerGPU is one whole GPU in the pool's share unit.
const MilliPerGPU = 1000

// Server is a GPU host as it registers with the pool.
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
	// Healthy is false when the daemon reports the device broken or gone;
	// an unhealthy GPU keeps its leases but takes no new ones.
	Healthy bool `json:"healthy"`
}

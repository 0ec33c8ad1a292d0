package api

import "time"

// Console is the pool as the console page shows it (GET /v1/console),
// scoped to the token as the rest of the API is: servers, GPUs and their
// shares are everyone's; leases, pending requests and tenants are the
// token's namespace's, or every namespace's for the admin token. Shares
// are in GPUs (0.5 is half a GPU); use is measured by the GPU servers'
// daemons and arrives with their heartbeats.
type Console struct {
	At time.Time `json:"at"`
	// Namespace is the token's namespace; empty for the admin token.
	Namespace string `json:"namespace,omitempty"`
	// Policy is the placement policy whose measure Fragmentation is.
	Policy string         `json:"policy"`
	Models []ModelSummary `json:"models"`
	// Servers are sorted by name.
	Servers []ConsoleServer `json:"servers"`
	// FragmentationGPUs is the share stranded pool-wide: the free share
	// the expected workload cannot use (FGD's measure), summed over the
	// servers.
	FragmentationGPUs float64          `json:"fragmentationGPUs"`
	Tenants           []ConsoleTenant  `json:"tenants"`
	Leases            []ConsoleLease   `json:"leases"`
	Pending           []ConsolePending `json:"pending"`
	// History is the pool's leased and used share over the last hour,
	// oldest first, one point per HistoryInterval.
	History []HistoryPoint `json:"history"`
}

// IdleUse is the use of its share under which a lease held for
// IdleWindow counts as idle but held, in a namespace whose idle policy
// does not say otherwise.
const (
	IdleUse    = 0.1
	IdleWindow = 5 * time.Minute
)

// HistoryInterval and HistoryLength are the console's history: one point
// every 10 s over the last hour.
const (
	HistoryInterval = 10 * time.Second
	HistoryLength   = 360
)

// ModelSummary is one GPU model across the pool.
type ModelSummary struct {
	Model string `json:"model"`
	GPUs  int    `json:"gpus"`
	// Healthy counts the GPUs reported healthy on servers that are not
	// silent: those that can take a lease.
	Healthy int `json:"healthy"`
	// LeasedGPUs is the share leases hold; UsedGPUs what they measurably
	// use (SM time, in GPUs); IdleHeldGPUs the share held by leases whose
	// use stayed under IdleUse of their share over IdleWindow.
	LeasedGPUs   float64 `json:"leasedGPUs"`
	UsedGPUs     float64 `json:"usedGPUs"`
	IdleHeldGPUs float64 `json:"idleHeldGPUs"`
	// FreeGPUs is the headroom: the share of healthy GPUs on servers that
	// take leases that no lease holds. PendingGPUs is the demand of the
	// requests waiting that this model could serve.
	FreeGPUs    float64 `json:"freeGPUs"`
	PendingGPUs float64 `json:"pendingGPUs"`
}

// ConsoleServer is one GPU server and its GPUs.
type ConsoleServer struct {
	Name string `json:"name"`
	// Schedulable is false while the server is silent (no heartbeat within
	// the allocator's timeout); Healthy is false when it is silent or any
	// of its GPUs is unhealthy.
	Schedulable   bool      `json:"schedulable"`
	Healthy       bool      `json:"healthy"`
	LastHeartbeat time.Time `json:"lastHeartbeat"`
	// SampledAt is when the daemon last read the GPUs, as its latest
	// heartbeat said; zero when it has reported no use.
	SampledAt time.Time `json:"sampledAt"`
	Leases    int       `json:"leases"`
	// FragmentationGPUs is 0 for a silent server, whose free share is
	// unreachable rather than stranded.
	FragmentationGPUs float64      `json:"fragmentationGPUs"`
	GPUs              []ConsoleGPU `json:"gpus"`
}

// ConsoleGPU is one GPU: its leased share, its measured use and its links
// to the server's other GPUs.
type ConsoleGPU struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Model       string `json:"model"`
	Healthy     bool   `json:"healthy"`
	MemoryBytes int64  `json:"memoryBytes"`
	// LeasedPercent is the share leases hold, in percent.
	LeasedPercent float64 `json:"leasedPercent"`
	// Utilization is the GPU's SM use (0..1) and MemoryUsedBytes its memory
	// in use, as its daemon last measured them; nil and 0 when unknown.
	Utilization     *float64 `json:"utilization,omitempty"`
	MemoryUsedBytes int64    `json:"memoryUsedBytes"`
	// Links are the links to the server's other GPUs ("nvlink",
	// "pcie-switch", "socket", "any"), by their index; empty when the
	// topology is not known.
	Links []string `json:"links,omitempty"`
}

// ConsoleTenant is one namespace: its quota and what it holds.
type ConsoleTenant struct {
	Namespace string `json:"namespace"`
	// HardGPUs is the quota, 0 when the namespace has none; QuotaUsedGPUs
	// what its leases count against it.
	HardGPUs      float64 `json:"hardGPUs"`
	QuotaUsedGPUs float64 `json:"quotaUsedGPUs"`
	Leases        int     `json:"leases"`
	Pods          int     `json:"pods"`
	// Apps are the distinct values of the owners' app label.
	Apps       []string `json:"apps,omitempty"`
	LeasedGPUs float64  `json:"leasedGPUs"`
	UsedGPUs   float64  `json:"usedGPUs"`
	Pending    int      `json:"pending"`
}

// ConsoleLease is one lease as the leases table shows it.
type ConsoleLease struct {
	ID        string `json:"id"`
	Namespace string `json:"namespace"`
	Pod       string `json:"pod,omitempty"`
	App       string `json:"app,omitempty"`
	Server    string `json:"server"`
	GPUs      []int  `json:"gpus"`
	// ShareGPUs is the share held, summed over the GPUs; Use the measured
	// SM use over that share (0..1 and above when it bursts), nil before
	// the daemon reports it.
	ShareGPUs   float64  `json:"shareGPUs"`
	MemoryBytes int64    `json:"memoryBytes"`
	Use         *float64 `json:"use,omitempty"`
	// IdleSeconds is how long the lease has been measured idle, every
	// sample under its namespace's idle policy's bar (absent while it is
	// in use or not measured); Idle is whether that is the policy's whole
	// window; ReclaimAt, under a policy that reclaims, when its GPUs are
	// given back unless it is used before.
	IdleSeconds *float64   `json:"idleSeconds,omitempty"`
	Idle        bool       `json:"idle"`
	ReclaimAt   *time.Time `json:"reclaimAt,omitempty"`
	GrantedAt   time.Time  `json:"grantedAt"`
	ExpiresAt   *time.Time `json:"expiresAt,omitempty"`
	TTL         string     `json:"ttl,omitempty"`
}

// Reasons a request waits.
const (
	WaitCapacity = "capacity"
	WaitQuota    = "quota"
	WaitModel    = "model"
	WaitTopology = "topology"
)

// ConsolePending is a request waiting, and why.
type ConsolePending struct {
	Namespace string    `json:"namespace"`
	Pod       string    `json:"pod,omitempty"`
	GPUs      int       `json:"gpus"`
	ShareGPUs float64   `json:"shareGPUs"`
	Models    []string  `json:"models,omitempty"`
	Topology  string    `json:"topology,omitempty"`
	Since     time.Time `json:"since"`
	// Reason is one of the Wait constants: the first of quota, model,
	// topology and capacity that keeps it from fitting now; Message is the
	// allocator's own words.
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// HistoryPoint is the pool at one moment of the history.
type HistoryPoint struct {
	At         time.Time `json:"at"`
	GPUs       int       `json:"gpus"`
	LeasedGPUs float64   `json:"leasedGPUs"`
	UsedGPUs   float64   `json:"usedGPUs"`
}

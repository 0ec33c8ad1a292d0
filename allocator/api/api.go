// Package api holds the allocator's HTTP wire types, shared by the server
// (allocator/service) and the typed client (allocator/client), and their
// conversions to and from the allocator's own types (New..., Core). All
// paths are under /v1; bodies are JSON. A GPU share is a number of percent
// of one GPU in a field whose name ends in Percent (or "percent"),
// durations are Go duration strings ("30s"), times RFC 3339.
//
//	PUT    /v1/servers/{name}            register or update a GPU server (Server)
//	POST   /v1/servers/{name}/heartbeat  heartbeat with GPU health (Heartbeat)
//	POST   /v1/leases                    acquire (AcquireRequest) -> Lease
//	GET    /v1/leases?namespace=&server=&ownerUID=&selector=   list leases
//	GET    /v1/leases/{id}               one lease
//	POST   /v1/leases/{id}/renew         renew (RenewRequest) -> Lease
//	DELETE /v1/leases/{id}               release
//	GET    /v1/pool                      servers, GPUs, allocated share, health (PoolStatus)
//	GET    /v1/quotas                    quota hard and used per namespace
//	PUT    /v1/quotas/{namespace}        set a quota, admin only (QuotaRequest) -> QuotaStatus
//	DELETE /v1/quotas/{namespace}        remove a quota, admin only -> QuotaStatus
//
// Errors come back as an Error body with an HTTP status that says who
// must act: 400 bad input, 401 no or unknown token, 403 another namespace,
// an admin's operation or quota exceeded, 404 unknown lease or server, 409 no capacity or an
// idempotency conflict, 429 an acquisition that would wait where too many
// wait already, 503 not the leader or the store failed.
package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/internal/jsonscan"
	"github.com/gpupool/gpupool/inventory"
)

// AcquireRequest asks for a lease, in the units users write in pod specs.
type AcquireRequest struct {
	Namespace string `json:"namespace"`
	// GPUAmount, GPUPercent and GPUMemory are bitfusion.io/gpu-amount,
	// gpu-percent and gpu-memory (a quantity such as "8000M" or "16Gi").
	GPUAmount  int    `json:"gpuAmount"`
	GPUPercent int    `json:"gpuPercent,omitempty"`
	GPUMemory  string `json:"gpuMemory,omitempty"`
	// CPU and Memory are quantities as in a pod's requests ("500m", "4Gi").
	CPU    string   `json:"cpu,omitempty"`
	Memory string   `json:"memory,omitempty"`
	Models []string `json:"models,omitempty"`
	// Topology is the least link each pair of the lease's GPUs must have:
	// any (the default), socket, pcie-switch or nvlink.
	Topology string `json:"topology,omitempty"`
	// Servers restricts placement to the servers of these names (the
	// nodes a Kubernetes scheduler found feasible); empty means any.
	Servers        Names  `json:"servers,omitempty"`
	Owner          Owner  `json:"owner"`
	IdempotencyKey string `json:"idempotencyKey,omitempty"`
	// TTL is how long the lease lives unrenewed ("30s"); empty takes the
	// allocator's default. UntilReleased asks instead for a lease that
	// never expires and lives until released. Wait queues the request up
	// to that long when there is no capacity or quota, instead of failing
	// at once.
	TTL           string `json:"ttl,omitempty"`
	UntilReleased bool   `json:"untilReleased,omitempty"`
	Wait          string `json:"wait,omitempty"`
	// AnswerBeforeDurable asks for the answer as soon as the lease is
	// granted, before the grant is durable: a crash of the allocator may
	// still lose it. The same request again, without it, answers once the
	// grant is durable. A scheduler asks so inside its scheduling loop,
	// and again before it binds.
	AnswerBeforeDurable bool `json:"answerBeforeDurable,omitempty"`

	// percentGiven tells an explicit "gpuPercent": 0, which is out of
	// range, from no gpuPercent at all, which asks for whole GPUs.
	percentGiven bool
}

// UnmarshalJSON decodes the request, refusing unknown fields, and notes
// whether gpuPercent was sent.
func (a *AcquireRequest) UnmarshalJSON(data []byte) error {
	type plain AcquireRequest // without this method
	var fields struct {
		plain
		GPUPercent *int `json:"gpuPercent,omitempty"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&fields); err != nil {
		return err
	}
	*a = AcquireRequest(fields.plain)
	if fields.GPUPercent != nil {
		a.GPUPercent, a.percentGiven = *fields.GPUPercent, true
	}
	return nil
}

// Names is a list of names decoded in one pass over the JSON, without
// reflection: a scheduler's acquisition names every feasible node of a
// cluster, thousands, on every pod.
type Names []string

// UnmarshalJSON implements json.Unmarshaler; encoding/json has checked
// the JSON before it calls this.
func (n *Names) UnmarshalJSON(data []byte) error {
	s := jsonscan.New(data)
	s.Space()
	if s.Literal("null") {
		*n = nil
		return nil
	}
	if !s.Byte('[') {
		return errors.New("servers: not a list of names")
	}
	names := make(Names, 0, bytes.Count(data, []byte{','})+1)
	for s.Space(); !s.Byte(']'); s.Space() {
		s.Byte(',')
		s.Space()
		raw, ok := s.Str()
		if !ok {
			return errors.New("servers: a name that is not a string")
		}
		name, err := jsonscan.Unquote(raw)
		if err != nil {
			return err
		}
		names = append(names, name)
	}
	*n = names
	return nil
}

// MaxWait bounds how long one request may queue.
const MaxWait = time.Hour

// Parse turns the wire form into the allocator's request and the time to
// wait; bad fields come back as *allocator.FieldError.
func (a *AcquireRequest) Parse() (allocator.Request, time.Duration, error) {
	r := allocator.Request{
		Namespace: a.Namespace, GPUs: a.GPUAmount, Percent: a.GPUPercent, Models: a.Models, Servers: a.Servers,
		Owner: a.Owner.Core(), IdempotencyKey: a.IdempotencyKey, UntilReleased: a.UntilReleased,
	}
	var err error
	if a.GPUMemory != "" {
		if r.GPUMemoryBytes, err = allocator.ParseGPUMemory(a.GPUMemory); err != nil {
			return r, 0, err
		}
	}
	if a.Topology != "" {
		if r.Topology, err = inventory.ParseLink("topology", a.Topology); err != nil {
			return r, 0, err
		}
	}
	if a.percentGiven && a.GPUPercent == 0 {
		return r, 0, &allocator.FieldError{Field: "gpu-percent", Value: "0", Limit: "out of range 1..100 (leave it out for whole GPUs)"}
	}
	if r.CPUMilli, err = quantity("cpu", a.CPU, allocator.MaxCPUMilli, true); err != nil {
		return r, 0, err
	}
	if r.MemoryBytes, err = quantity("memory", a.Memory, allocator.MaxMemoryBytes, false); err != nil {
		return r, 0, err
	}
	if r.TTL, err = ParseDuration("ttl", a.TTL, 0); err != nil {
		return r, 0, err
	}
	wait, err := ParseDuration("wait", a.Wait, MaxWait)
	if err != nil {
		return r, 0, err
	}
	if len(a.IdempotencyKey) > 253 {
		return r, 0, &allocator.FieldError{Field: "idempotencyKey", Value: a.IdempotencyKey[:16] + "...", Limit: "longer than 253 characters"}
	}
	return r, wait, r.Validate()
}

// quantity parses an optional Kubernetes quantity within 0..max; milli
// returns thousandths (CPU).
func quantity(field, s string, max int64, milli bool) (int64, error) {
	if s == "" {
		return 0, nil
	}
	return allocator.ParseQuantity(field, s, 0, max, milli)
}

// ParseDuration parses a Go duration such as "30s" within 0..limit (no
// limit when limit is 0); a bad one is a *allocator.FieldError.
func ParseDuration(field, s string, limit time.Duration) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || limit > 0 && d > limit {
		bound := "must be a duration such as 30s or 5m, at least 0"
		if limit > 0 {
			bound = "must be a duration such as 30s or 5m, in 0.." + limit.String()
		}
		return 0, &allocator.FieldError{Field: field, Value: s, Limit: bound}
	}
	return d, nil
}

// RenewRequest extends a lease; an empty TTL renews by the lease's own.
type RenewRequest struct {
	TTL string `json:"ttl,omitempty"`
}

// Heartbeat tells the allocator a server is alive and how its GPUs are.
type Heartbeat struct {
	GPUs []GPUHealth `json:"gpus"`
	// Use is what the daemon measured last, for the console; left out
	// before its first good round, and by daemons older than the field.
	Use *ServerUse `json:"use,omitempty"`
}

// ServerUse is a server's latest measured use.
type ServerUse struct {
	SampledAt time.Time  `json:"sampledAt"`
	GPUs      []GPUUse   `json:"gpus"`
	Leases    []LeaseUse `json:"leases,omitempty"`
}

// GPUUse is one GPU's reading: its SM use (0..1, nil when the source
// cannot tell) and its memory in use.
type GPUUse struct {
	Index           int      `json:"index"`
	Utilization     *float64 `json:"utilization,omitempty"`
	MemoryUsedBytes int64    `json:"memoryUsedBytes"`
}

// LeaseUse is what one lease's processes use of one GPU: their share of
// its SM time (0..1, nil when the source cannot tell) and memory.
type LeaseUse struct {
	Lease           string   `json:"lease"`
	GPU             int      `json:"gpu"`
	SMUtilization   *float64 `json:"smUtilization,omitempty"`
	MemoryUsedBytes int64    `json:"memoryUsedBytes"`
}

// GPUHealth is one GPU's health in a heartbeat.
type GPUHealth struct {
	Index   int  `json:"index"`
	Healthy bool `json:"healthy"`
}

// PoolStatus is the pool as `gpupool pool status` shows it.
type PoolStatus struct {
	Servers []ServerStatus `json:"servers"`
	// Pending are the requests queued for capacity or quota, oldest first.
	Pending []PendingRequest `json:"pending,omitempty"`
}

// PendingRequest is a lease request waiting for capacity or quota.
type PendingRequest struct {
	Namespace      string    `json:"namespace"`
	Owner          Owner     `json:"owner"`
	GPUs           int       `json:"gpus"`
	Percent        int       `json:"percent,omitempty"`
	GPUMemoryBytes int64     `json:"gpuMemoryBytes,omitempty"`
	Since          time.Time `json:"since"`
}

// ServerStatus is one server and what is leased on it.
type ServerStatus struct {
	Name          string            `json:"name"`
	Labels        map[string]string `json:"labels,omitempty"`
	Schedulable   bool              `json:"schedulable"`
	LastHeartbeat time.Time         `json:"lastHeartbeat"`
	CPUMilli      int64             `json:"cpuMilli,omitempty"`
	CPUFreeMilli  int64             `json:"cpuFreeMilli,omitempty"`
	GPUs          []GPUStatus       `json:"gpus"`
	Leases        int               `json:"leases"`
}

// GPUStatus is one GPU's capacity and leased share.
type GPUStatus struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Model       string `json:"model"`
	MemoryBytes int64  `json:"memoryBytes"`
	Healthy     bool   `json:"healthy"`
	// Links[j] is how this GPU reaches gpus[j], as the server registered
	// them; absent when its daemon does not know.
	Links []inventory.Link `json:"links,omitempty"`
	// AllocatedPercent is the share leases hold, in percent of the GPU.
	AllocatedPercent float64 `json:"allocatedPercent"`
	AllocatedBytes   int64   `json:"allocatedMemoryBytes"`
}

// Allocated is the share leases hold.
func (g GPUStatus) Allocated() allocator.Share { return allocator.SharePercent(g.AllocatedPercent) }

// QuotaRequest sets a namespace's hard GPU quota (PUT
// /v1/quotas/{namespace}), in percent of one GPU: 150 is 1.5 GPUs, to a
// tenth of a percent (a milli-GPU).
type QuotaRequest struct {
	// HardPercent is required: null or missing is refused rather than
	// read as a quota of 0, which would admit nothing.
	HardPercent *float64 `json:"hardPercent"`
}

// QuotaList is the answer to GET /v1/quotas.
type QuotaList struct {
	Quotas []QuotaStatus `json:"quotas"`
}

// QuotaStatus is a namespace's GPU quota and use, in percent of one GPU,
// the unit of requests.bitfusion.io/gpu.
type QuotaStatus struct {
	Namespace string `json:"namespace"`
	// Limited is false for a namespace without a quota; HardPercent is
	// then 0.
	Limited     bool    `json:"limited"`
	HardPercent float64 `json:"hardPercent"`
	UsedPercent float64 `json:"usedPercent"`
}

// NewQuotaStatus is q on the wire.
func NewQuotaStatus(q allocator.QuotaStatus) QuotaStatus {
	return QuotaStatus{Namespace: q.Namespace, Limited: q.Limited, HardPercent: q.Hard.Percent(), UsedPercent: q.Used.Percent()}
}

// Core is q as the allocator holds it.
func (q QuotaStatus) Core() allocator.QuotaStatus {
	return allocator.QuotaStatus{Namespace: q.Namespace, Limited: q.Limited,
		Hard: allocator.SharePercent(q.HardPercent), Used: allocator.SharePercent(q.UsedPercent)}
}

// Error is the body of every non-2xx answer.
type Error struct {
	Reason  string `json:"reason"` // one of the Reason constants
	Message string `json:"message"`
	// Field, Value and Limit repeat a FieldError's parts.
	Field string `json:"field,omitempty"`
	Value string `json:"value,omitempty"`
	Limit string `json:"limit,omitempty"`
}

// Reasons in Error bodies.
const (
	ReasonInvalid          = "Invalid"
	ReasonUnauthorized     = "Unauthorized"
	ReasonForbidden        = "Forbidden"
	ReasonQuotaExceeded    = "QuotaExceeded"
	ReasonNotFound         = "NotFound"
	ReasonNoCapacity       = "NoCapacity"
	ReasonConflict         = "Conflict"
	ReasonUnavailable      = "Unavailable"
	ReasonInternal         = "Internal"
	ReasonRequestTooLarge  = "RequestTooLarge"
	ReasonMethodNotAllowed = "MethodNotAllowed"
	// ReasonTooManyWaiting refuses to queue an acquisition that may wait
	// (429): too many wait already, in its namespace or in all.
	ReasonTooManyWaiting = "TooManyWaiting"
	// ReasonTooManyRequests refuses a read past its token's bound of
	// reads in progress (429).
	ReasonTooManyRequests = "TooManyRequests"
)

func (e *Error) Error() string { return e.Message }

// WriteError answers an HTTP request with status and e as its body, as
// every gpupool API answers a failure.
func WriteError(w http.ResponseWriter, status int, e *Error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(e)
}

package store

import (
	"encoding/json"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/inventory"
)

// The records below are how servers, leases and quotas are written in every store,
// bolt and etcd alike: the JSON the allocator has always written, field by
// field, so that a store written by any version reads back. They change
// only with a way to read what the previous form wrote.

type serverRecord struct {
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels,omitempty"`
	CPUMilli    int64             `json:"cpuMilli,omitempty"`
	MemoryBytes int64             `json:"memoryBytes,omitempty"`
	GPUs        []gpuRecord       `json:"gpus"`
}

type gpuRecord struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Model       string `json:"model"`
	MemoryBytes int64  `json:"memoryBytes"`
	Healthy     bool   `json:"healthy"`
	// Links is the GPU's topology row; records written before servers
	// carried topology have none.
	Links []inventory.Link `json:"links,omitempty"`
}

type leaseRecord struct {
	ID          string           `json:"id"`
	Namespace   string           `json:"namespace"`
	Owner       ownerRecord      `json:"owner"`
	Server      string           `json:"server"`
	GPUs        []leaseGPURecord `json:"gpus,omitempty"`
	CPUMilli    int64            `json:"cpuMilli,omitempty"`
	MemoryBytes int64            `json:"memoryBytes,omitempty"`
	Request     requestRecord    `json:"request"`
	TTL         time.Duration    `json:"ttl"` // nanoseconds
	GrantedAt   time.Time        `json:"grantedAt"`
	ExpiresAt   time.Time        `json:"expiresAt"`
}

type leaseGPURecord struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Model       string `json:"model"`
	Milli       int64  `json:"milli"` // allocator.Share
	MemoryBytes int64  `json:"memoryBytes"`
}

type requestRecord struct {
	Namespace      string         `json:"namespace"`
	GPUs           int            `json:"gpuAmount"`
	Percent        int            `json:"gpuPercent,omitempty"`
	GPUMemoryBytes int64          `json:"gpuMemoryBytes,omitempty"`
	CPUMilli       int64          `json:"cpuMilli,omitempty"`
	MemoryBytes    int64          `json:"memoryBytes,omitempty"`
	Models         []string       `json:"models,omitempty"`
	Topology       inventory.Link `json:"topology,omitempty"`
	Owner          ownerRecord    `json:"owner"`
	IdempotencyKey string         `json:"idempotencyKey,omitempty"`
	TTL            time.Duration  `json:"ttl,omitempty"` // nanoseconds
	UntilReleased  bool           `json:"untilReleased,omitempty"`
}

// quotaRecord is a namespace's quota; a removed one is kept, not limited.
type quotaRecord struct {
	Namespace string `json:"namespace"`
	Limited   bool   `json:"limited"`
	HardMilli int64  `json:"hardMilli,omitempty"` // allocator.Share
}

type ownerRecord struct {
	Pod    string            `json:"pod,omitempty"`
	UID    string            `json:"uid,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
}

// appendDecoded decodes one record onto out.
func appendDecoded[T any](out *[]T, decode func([]byte) (T, error), data []byte) error {
	x, err := decode(data)
	if err == nil {
		*out = append(*out, x)
	}
	return err
}

// putRecords encodes each of records and hands it to put under its key.
func putRecords[T any](records []T, key func(*T) string, encode func(*T) ([]byte, error), put func(key string, data []byte) error) error {
	for i := range records {
		data, err := encode(&records[i])
		if err != nil {
			return err
		}
		if err := put(key(&records[i]), data); err != nil {
			return err
		}
	}
	return nil
}

// The keys of records within their kind.
func serverKey(s *inventory.Server) string { return s.Name }
func leaseKey(l *allocator.Lease) string   { return l.ID }
func quotaKey(q *Quota) string             { return q.Namespace }

func encodeServer(s *inventory.Server) ([]byte, error) {
	r := serverRecord{Name: s.Name, Labels: s.Labels, CPUMilli: s.CPUMilli, MemoryBytes: s.MemoryBytes, GPUs: []gpuRecord{}}
	for _, g := range s.GPUs {
		r.GPUs = append(r.GPUs, gpuRecord(g))
	}
	return json.Marshal(r)
}

func decodeServer(data []byte) (inventory.Server, error) {
	var r serverRecord
	if err := json.Unmarshal(data, &r); err != nil {
		return inventory.Server{}, err
	}
	s := inventory.Server{Name: r.Name, Labels: r.Labels, CPUMilli: r.CPUMilli, MemoryBytes: r.MemoryBytes}
	for _, g := range r.GPUs {
		s.GPUs = append(s.GPUs, inventory.GPU(g))
	}
	return s, nil
}

func encodeLease(l *allocator.Lease) ([]byte, error) {
	q := &l.Request
	r := leaseRecord{
		ID: l.ID, Namespace: l.Namespace, Owner: ownerRecord(l.Owner), Server: l.Server,
		CPUMilli: l.CPUMilli, MemoryBytes: l.MemoryBytes, TTL: l.TTL, GrantedAt: l.GrantedAt, ExpiresAt: l.ExpiresAt,
		Request: requestRecord{
			Namespace: q.Namespace, GPUs: q.GPUs, Percent: q.Percent, GPUMemoryBytes: q.GPUMemoryBytes,
			CPUMilli: q.CPUMilli, MemoryBytes: q.MemoryBytes, Models: q.Models, Topology: q.Topology, Owner: ownerRecord(q.Owner),
			IdempotencyKey: q.IdempotencyKey, TTL: q.TTL, UntilReleased: q.UntilReleased,
		},
	}
	for _, g := range l.GPUs {
		r.GPUs = append(r.GPUs, leaseGPURecord{Index: g.Index, UUID: g.UUID, Model: g.Model, Milli: int64(g.Share), MemoryBytes: g.MemoryBytes})
	}
	return json.Marshal(r)
}

func decodeLease(data []byte) (allocator.Lease, error) {
	var r leaseRecord
	if err := json.Unmarshal(data, &r); err != nil {
		return allocator.Lease{}, err
	}
	q := &r.Request
	l := allocator.Lease{
		ID: r.ID, Namespace: r.Namespace, Owner: allocator.Owner(r.Owner), Server: r.Server,
		CPUMilli: r.CPUMilli, MemoryBytes: r.MemoryBytes, TTL: r.TTL, GrantedAt: r.GrantedAt, ExpiresAt: r.ExpiresAt,
		Request: allocator.Request{
			Namespace: q.Namespace, GPUs: q.GPUs, Percent: q.Percent, GPUMemoryBytes: q.GPUMemoryBytes,
			CPUMilli: q.CPUMilli, MemoryBytes: q.MemoryBytes, Models: q.Models, Topology: q.Topology, Owner: allocator.Owner(q.Owner),
			IdempotencyKey: q.IdempotencyKey, TTL: q.TTL, UntilReleased: q.UntilReleased,
		},
	}
	for _, g := range r.GPUs {
		l.GPUs = append(l.GPUs, allocator.LeaseGPU{Index: g.Index, UUID: g.UUID, Model: g.Model, Share: allocator.Share(g.Milli), MemoryBytes: g.MemoryBytes})
	}
	return l, nil
}

func encodeQuota(q *Quota) ([]byte, error) {
	return json.Marshal(quotaRecord{Namespace: q.Namespace, Limited: q.Limited, HardMilli: int64(q.Hard)})
}

func decodeQuota(data []byte) (Quota, error) {
	var r quotaRecord
	if err := json.Unmarshal(data, &r); err != nil {
		return Quota{}, err
	}
	return Quota{Namespace: r.Namespace, Limited: r.Limited, Hard: allocator.Share(r.HardMilli)}, nil
}

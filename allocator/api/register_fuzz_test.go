package api

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/inventory"
)

// FuzzRegisterServer registers arbitrary server bodies, as the allocator
// decodes PUT /v1/servers/{name}, into a pool that holds leases: a refusal
// is a *FieldError naming the field and the limit, and what is accepted
// keeps the pool's books and every lease's share within 0..100% of a GPU,
// whatever share of it a memory request then asks.
func FuzzRegisterServer(f *testing.F) {
	for _, seed := range []string{
		`{"name":"gpu-0","gpus":[{"index":0,"uuid":"GPU-0","model":"A100","memoryBytes":85899345920,"healthy":true}]}`,
		`{"name":"gpu-1","cpuMilli":64000,"memoryBytes":274877906944,"labels":{"gpupool.io/daemon-url":"http://10.0.0.1:8471"},"gpus":[]}`,
		`{"name":"../gpu1","gpus":[]}`,
		`{"name":"GPU_1","gpus":[]}`,
		`{"name":"huge","gpus":[{"index":0,"uuid":"u","model":"A100","memoryBytes":4611686018427387904,"healthy":true}]}`,
		`{"name":"neg","cpuMilli":-1,"memoryBytes":-5,"gpus":[{"index":1,"model":""}]}`,
		`{"name":"l","labels":{"not a key":"x"},"gpus":[]}`,
	} {
		f.Add([]byte(seed), int64(1<<30))
	}
	// Once a GPU of 2^62 bytes and a request of as much gave milli -1.
	f.Add([]byte(`{"name":"huge","gpus":[{"index":0,"uuid":"u","model":"A100","memoryBytes":4611686018427387904,"healthy":true}]}`), int64(1<<62))
	f.Fuzz(func(t *testing.T, body []byte, askBytes int64) {
		var wire Server
		if json.Unmarshal(body, &wire) != nil {
			return
		}
		s := wire.Core()
		pol, _ := allocator.NewPolicy("best-fit", allocator.PolicyOptions{})
		p, _ := allocator.NewPool(allocator.PoolConfig{Policy: pol, DefaultTTL: time.Minute, MaxTTL: time.Hour})
		now := time.Unix(1e9, 0)
		held := inventory.Server{Name: "held", GPUs: []inventory.GPU{{UUID: "GPU-h", Model: "A100", MemoryBytes: 80 << 30, Healthy: true}}}
		if err := p.RegisterServer(held); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Acquire(now, allocator.Request{Namespace: "ml", GPUs: 1, Percent: 50}); err != nil {
			t.Fatal(err)
		}
		if err := p.RegisterServer(s); err != nil {
			var field *allocator.FieldError
			if !errors.As(err, &field) || field.Field == "" || field.Limit == "" {
				t.Fatalf("refusal %v is not a FieldError naming the field and the limit", err)
			}
			return
		}
		if err := p.CheckInvariants(); err != nil {
			t.Fatalf("registering %s broke the books: %v", body, err)
		}
		l, err := p.Acquire(now, allocator.Request{Namespace: "ml", GPUs: 1, GPUMemoryBytes: askBytes, Models: modelsOf(&s)})
		if err != nil {
			return
		}
		for _, g := range l.GPUs {
			if g.Share <= 0 || g.Share > allocator.WholeGPU || g.MemoryBytes < 0 {
				t.Fatalf("a %d-byte request on %s got share %s (%d bytes)", askBytes, body, g.Share, g.MemoryBytes)
			}
		}
		if err := p.CheckInvariants(); err != nil {
			t.Fatal(err)
		}
	})
}

func modelsOf(s *inventory.Server) []string {
	var out []string
	for _, g := range s.GPUs {
		out = append(out, g.Model)
	}
	return out
}

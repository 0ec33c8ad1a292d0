package api

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator"
)

// TestLeaseOnTheWire: a lease goes out with its shares in percent of the
// GPU and its TTL as a Go duration, as requests send them.
func TestLeaseOnTheWire(t *testing.T) {
	granted := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := allocator.Lease{
		ID: "lease-000001", Namespace: "ml", Server: "gpu-a", CPUMilli: 500,
		Owner:   allocator.Owner{Pod: "train-0", Labels: map[string]string{"app": "tf"}},
		GPUs:    []allocator.LeaseGPU{{Index: 1, UUID: "GPU-1", Model: "A100", Share: 466, MemoryBytes: 8_000_000_000}},
		Request: allocator.Request{Namespace: "ml", GPUs: 1, GPUMemoryBytes: 8_000_000_000, IdempotencyKey: "k1"},
		TTL:     30 * time.Second, GrantedAt: granted, ExpiresAt: granted.Add(30 * time.Second),
	}
	got, err := json.Marshal(NewLease(l))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"lease-000001","namespace":"ml","owner":{"pod":"train-0","labels":{"app":"tf"}},"server":"gpu-a",` +
		`"gpus":[{"index":1,"uuid":"GPU-1","model":"A100","percent":46.6,"memoryBytes":8000000000}],"cpuMilli":500,` +
		`"idempotencyKey":"k1","ttl":"30s","grantedAt":"2026-01-01T00:00:00Z","expiresAt":"2026-01-01T00:00:30Z"}`
	if string(got) != want {
		t.Errorf("lease on the wire:\n%s\nwant\n%s", got, want)
	}
	var back Lease
	if err := json.Unmarshal(got, &back); err != nil {
		t.Fatal(err)
	}
	l.Request = allocator.Request{}
	if core := back.Core(); !reflect.DeepEqual(core, l) {
		t.Errorf("back from the wire: %+v\nwant %+v", core, l)
	}
	if err := json.Unmarshal([]byte(`{"ttl":30000000000}`), &back); err == nil {
		t.Error("a TTL in nanoseconds was taken; the wire has Go durations")
	}
}

// TestLeaseUntilReleasedOnTheWire: a lease that lives until released says
// so and has no TTL or expiry to misread; it comes back as one.
func TestLeaseUntilReleasedOnTheWire(t *testing.T) {
	granted := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := allocator.Lease{ID: "lease-000002", Namespace: "ml", Server: "gpu-a", GrantedAt: granted,
		GPUs: []allocator.LeaseGPU{{Index: 0, UUID: "GPU-0", Model: "A100", Share: allocator.WholeGPU, MemoryBytes: 80 << 30}}}
	got, err := json.Marshal(NewLease(l))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"lease-000002","namespace":"ml","owner":{},"server":"gpu-a",` +
		`"gpus":[{"index":0,"uuid":"GPU-0","model":"A100","percent":100,"memoryBytes":85899345920}],` +
		`"untilReleased":true,"grantedAt":"2026-01-01T00:00:00Z"}`
	if string(got) != want {
		t.Errorf("lease on the wire:\n%s\nwant\n%s", got, want)
	}
	var back Lease
	if err := json.Unmarshal(got, &back); err != nil {
		t.Fatal(err)
	}
	if core := back.Core(); !core.UntilReleased() || !reflect.DeepEqual(core, l) {
		t.Errorf("back from the wire: %+v\nwant %+v, until released", core, l)
	}
}

// FuzzLeaseWire: any share of a GPU and any TTL come back from the wire
// exactly, though the wire writes shares as decimal percents.
func FuzzLeaseWire(f *testing.F) {
	f.Add(int64(466), int64(30*time.Second), int64(80<<30))
	f.Add(int64(1), int64(time.Nanosecond), int64(0))
	f.Add(int64(999), int64(87000*time.Hour), int64(1<<50))
	f.Fuzz(func(t *testing.T, share, ttl, memory int64) {
		l := allocator.Lease{ID: "lease-000001", Namespace: "ml", Server: "s",
			GPUs: []allocator.LeaseGPU{{Share: allocator.Share(share) % (allocator.WholeGPU + 1), MemoryBytes: memory}},
			TTL:  time.Duration(ttl), GrantedAt: time.Unix(1e9, 0).UTC(), ExpiresAt: time.Unix(1e9, 0).UTC().Add(time.Duration(ttl))}
		data, err := json.Marshal(NewLease(l))
		if err != nil {
			t.Fatal(err)
		}
		var back Lease
		if err := json.Unmarshal(data, &back); err != nil {
			t.Fatalf("%s does not decode: %v", data, err)
		}
		if core := back.Core(); !reflect.DeepEqual(core, l) {
			t.Fatalf("%s came back as %+v, want %+v", data, core, l)
		}
	})
}

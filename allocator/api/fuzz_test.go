package api

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/gpupool/gpupool/allocator"
)

// FuzzAcquireRequest decodes arbitrary bodies as the HTTP handler does:
// Parse must never panic, must reject with a *FieldError naming a field,
// and what it accepts must be within every limit.
// The corpus lives in testdata/fuzz/FuzzAcquireRequest.
func FuzzAcquireRequest(f *testing.F) {
	for _, seed := range []string{
		`{"namespace":"ml","gpuAmount":1,"gpuPercent":50}`,
		`{"namespace":"ml","gpuAmount":2,"gpuMemory":"16Gi","cpu":"500m","memory":"4Gi","ttl":"30s","wait":"1m"}`,
		`{"namespace":"ml","gpuAmount":1,"gpuMemory":"8000M","models":["A100","H100"],"idempotencyKey":"k"}`,
		`{"namespace":"Bad_NS","gpuAmount":-1,"gpuPercent":101,"gpuMemory":"1e400","ttl":"-1s"}`,
		`{"namespace":"ml","gpuAmount":1,"gpuPercent":0}`,
		`{"namespace":"ml","gpuAmount":1,"cpu":"1e30","memory":"1e19"}`,
		`{"namespace":"ml","gpuAmount":1,"gpuMemory":"8e18","ttl":"1ns"}`,
		`{"namespace":"ml","gpuAmount":0,"cpu":"1"}`,
		`{"namespace":"ml","gpuAmount":1,"owner":{"labels":{"a b":"c/d"}}}`,
		`{"namespace":"ml","gpuAmount":1,"servers":["node-1","node-2"],"untilReleased":true}`,
		`{"namespace":"ml","gpuAmount":1,"servers":[""],"untilReleased":true,"ttl":"1m"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var in AcquireRequest
		if json.Unmarshal(body, &in) != nil {
			return
		}
		r, wait, err := in.Parse()
		if err != nil {
			var field *allocator.FieldError
			if !errors.As(err, &field) || field.Field == "" || field.Limit == "" {
				t.Fatalf("rejection %v is not a FieldError naming the field and the limit", err)
			}
			return
		}
		if r.Validate() != nil || wait < 0 || wait > MaxWait || r.Percent < 0 || r.Percent > 100 || r.GPUs < 1 ||
			r.GPUMemoryBytes < 0 || r.GPUMemoryBytes > allocator.MaxGPUMemoryBytes || r.CPUMilli < 0 || r.CPUMilli > allocator.MaxCPUMilli ||
			r.MemoryBytes < 0 || r.MemoryBytes > allocator.MaxMemoryBytes || r.TTL < 0 || r.TTL > 0 && r.TTL < allocator.MinTTL ||
			in.percentGiven && r.Percent == 0 || r.UntilReleased && r.TTL != 0 || len(r.Servers) > allocator.MaxServers ||
			slices.Contains(r.Servers, "") {
			t.Fatalf("accepted out-of-range request %+v (wait %s)", r, wait)
		}
	})
}

// FuzzParseGPUMemory: any string gives positive bytes or a FieldError.
func FuzzParseGPUMemory(f *testing.F) {
	for _, s := range []string{"8000M", "16Gi", "0", "-1Gi", "1e3", "9223372036854775807", "99999999999999999999Ei", "1.5Gi", "", "1Ei", "8e18", "1Pi", "1025Ti"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := allocator.ParseGPUMemory(s)
		var field *allocator.FieldError
		switch {
		case err == nil && (b <= 0 || b > allocator.MaxGPUMemoryBytes):
			t.Fatalf("ParseGPUMemory(%q) = %d, want a size in 1..1Pi", s, b)
		case err != nil && (!errors.As(err, &field) || field.Field != "gpu-memory"):
			t.Fatalf("ParseGPUMemory(%q): %v is not a gpu-memory FieldError", s, err)
		}
	})
}

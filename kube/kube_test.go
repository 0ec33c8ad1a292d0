package kube

import (
	"strings"
	"testing"

	"github.com/gpupool/gpupool/allocator"
)

func TestUnitShare(t *testing.T) {
	const h100 = 80 << 30
	for _, c := range []struct {
		unit Unit
		n    int64
		want allocator.Share
	}{
		{UnitPercent, 100, allocator.WholeGPU},
		{UnitPercent, 50, allocator.WholeGPU / 2},
		{UnitPercent, 250, 5 * allocator.WholeGPU / 2},
		{UnitGPUs, 2, 2 * allocator.WholeGPU},
		{UnitGPUs, 32, 32 * allocator.WholeGPU},
		// The articles' memoryPerUnit: 8Gi, on 80Gi GPUs: ten to a GPU.
		{MemoryUnit(8 << 30), 10, allocator.WholeGPU},
		{MemoryUnit(8 << 30), 2, allocator.WholeGPU / 5},
		{MemoryUnit(8 << 30), 32, 32 * allocator.WholeGPU / 10},
		// 3Gi of 80Gi is 37.5 thousandths: rounded down, never above the quota.
		{MemoryUnit(1 << 30), 3, 37},
	} {
		if got := c.unit.Share(c.n, h100); got != c.want {
			t.Errorf("%s.Share(%d) = %v, want %v", c.unit, c.n, got, c.want)
		}
	}
}

func TestUnitPerGPU(t *testing.T) {
	for _, c := range []struct {
		unit   Unit
		memory int64
		want   int64
	}{
		{UnitPercent, 80 << 30, 100},
		{UnitGPUs, 80 << 30, 1},
		{MemoryUnit(8 << 30), 80 << 30, 10},
		// An H100's 79.6 GiB as NVML reports it: nine whole slices.
		{MemoryUnit(8 << 30), 81559 << 20, 9},
		{MemoryUnit(8 << 30), 4 << 30, 0},
	} {
		if got := c.unit.PerGPU(c.memory); got != c.want {
			t.Errorf("%s.PerGPU(%d) = %d, want %d", c.unit, c.memory, got, c.want)
		}
	}
}

func TestParseUnit(t *testing.T) {
	for _, s := range []string{"percent", "gpus", "memory:8Gi", "memory:16000M"} {
		if got, err := ParseUnit(s); err != nil || string(got) != s {
			t.Errorf("ParseUnit(%q) = %q, %v", s, got, err)
		}
	}
	if u := MemoryUnit(8 << 30); u != "memory:8Gi" || u.MemoryBytes() != 8<<30 {
		t.Errorf("MemoryUnit(8Gi) = %q of %d bytes", u, u.MemoryBytes())
	}
	if _, err := ParseUnit("GPU"); err == nil || err.Error() != `unit "GPU": must be one of percent, gpus, memory:<size>` {
		t.Errorf("ParseUnit(GPU) error = %v", err)
	}
	for _, bad := range []string{"memory:", "memory:lots", "memory:-8Gi", "memory:0", "memory:100", "memory:2Pi"} {
		if _, err := ParseUnit(bad); err == nil || !strings.Contains(err.Error(), "must be a quantity of GPU memory") {
			t.Errorf("ParseUnit(%q) error = %v", bad, err)
		}
	}
	if _, err := ParseUnit("memory:1.0000001Mi"); err == nil || !strings.Contains(err.Error(), "in whole bytes") {
		t.Errorf("ParseUnit(memory:1.0000001Mi) error = %v; want it refused as not whole bytes", err)
	}
}

func TestRequestAnnotationRoundTrip(t *testing.T) {
	want := Request{GPUAmount: 2, GPUMemory: "8000M", Models: []string{"A100"}}
	got, ok, err := RequestOf(map[string]string{AnnotationRequest: want.Annotation()})
	if err != nil || !ok || got.GPUAmount != 2 || got.GPUMemory != "8000M" || len(got.Models) != 1 {
		t.Fatalf("RequestOf(%s) = %+v, %v, %v", want.Annotation(), got, ok, err)
	}
	if _, ok, _ := RequestOf(nil); ok {
		t.Error("RequestOf(no annotation) reports one")
	}
	if _, _, err := RequestOf(map[string]string{AnnotationRequest: "{"}); err == nil {
		t.Error("RequestOf(bad JSON) gives no error")
	}
}

package kube

import (
	"testing"

	"github.com/gpupool/gpupool/allocator"
)

func TestUnitShare(t *testing.T) {
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
	} {
		if got := c.unit.Share(c.n); got != c.want {
			t.Errorf("%s.Share(%d) = %v, want %v", c.unit, c.n, got, c.want)
		}
	}
}

func TestParseUnit(t *testing.T) {
	for _, u := range Units {
		if got, err := ParseUnit(string(u)); err != nil || got != u {
			t.Errorf("ParseUnit(%q) = %q, %v", u, got, err)
		}
	}
	if _, err := ParseUnit("GPU"); err == nil || err.Error() != `unit "GPU": must be one of percent, gpus` {
		t.Errorf("ParseUnit(GPU) error = %v", err)
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

package admission

import (
	"flag"
	"fmt"
	"testing"

	"github.com/gpupool/gpupool/kube"
)

// TestUnitFlags: --unit and --gpu-memory parse into the unit and bytes,
// BFK's by default, and a bad value is refused naming its flag.
func TestUnitFlags(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		unit  kube.Unit
		bytes int64
		err   string
	}{
		{nil, kube.UnitPercent, 16_000_000_000, "<nil>"},
		{[]string{"--unit=gpus", "--gpu-memory=80Gi"}, kube.UnitGPUs, 80 << 30, "<nil>"},
		{[]string{"--unit=memory:8Gi"}, kube.MemoryUnit(8 << 30), 16_000_000_000, "<nil>"},
		{[]string{"--unit=halves"}, "", 0, `--unit: unit "halves": must be one of percent, gpus, memory:<size>`},
		{[]string{"--gpu-memory=lots"}, kube.UnitPercent, 0, `--gpu-memory: "lots" is not a quantity (e.g. 8000, 8000M or 16Gi)`},
	} {
		u := NewUnitFlags()
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		u.AddFlags(fs, "unit", "memory")
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if err := fmt.Sprint(u.Validate()); err != tc.err || u.Unit != tc.unit || u.GPUMemoryBytes != tc.bytes {
			t.Errorf("%q: %s, unit %q, %d bytes; want %s, %q, %d", tc.args, err, u.Unit, u.GPUMemoryBytes, tc.err, tc.unit, tc.bytes)
		}
	}
}

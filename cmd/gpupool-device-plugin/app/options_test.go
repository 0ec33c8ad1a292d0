package app

import (
	"fmt"
	"testing"

	"github.com/gpupool/gpupool/internal/cli/clitest"

	"github.com/gpupool/gpupool/kube"
)

// TestOptionsValidate: every flag Validate refuses is named with its
// value, the node may come from NODE_NAME, and the unit is parsed.
func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		nodeEnv string
		args    []string
		want    string // the error, "<nil>" when they pass
		unit    kube.Unit
	}{
		{args: nil, want: "--node is required (or NODE_NAME)"},
		{nodeEnv: "gpu-0", args: nil, want: "<nil>", unit: kube.UnitPercent},
		{args: []string{"--node", "gpu-0", "--unit", "gpus"}, want: "<nil>", unit: kube.UnitGPUs},
		{args: []string{"--node", "gpu-0", "--unit", "GPU"}, want: `--unit: unit "GPU": must be one of percent, gpus, memory:<size>`},
		{args: []string{"--node", "gpu-0", "--poll", "0s"}, want: "--poll 0s: must be above 0"},
		{args: []string{"--node", "gpu-0", "--poll", "-1s"}, want: "--poll -1s: must be above 0"},
	} {
		t.Setenv("NODE_NAME", tc.nodeEnv)
		o := NewOptions()
		if err := fmt.Sprint(clitest.Parse(t, o, tc.args...)); err != tc.want || o.Unit != tc.unit {
			t.Errorf("NODE_NAME=%s %q: %s, unit %q; want %s, %q", tc.nodeEnv, tc.args, err, o.Unit, tc.want, tc.unit)
		}
	}
}

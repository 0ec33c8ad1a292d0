package inventory

import (
	"strings"
	"testing"
)

func TestValidateUUIDTakesNVMLShapesOnly(t *testing.T) {
	for _, ok := range []string{
		"GPU-7c682f66-8b92-d30a-5893-1f2ad346d947", // an H100's, read with NVML
		"MIG-7c682f66-8b92-d30a-5893-1f2ad346d947",
		"MIG-GPU-7c682f66-8b92-d30a-5893-1f2ad346d947/1/0",
		"GPU-sim-gpu-1.example.com-3", // the simulated GPUs'
	} {
		if err := ValidateUUID("server.gpus[0].uuid", ok); err != nil {
			t.Errorf("ValidateUUID(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{
		"", "GPU-", "gpu-1", "7c682f66-8b92", "GPU-../..", "GPU-a/../..", "../..", "MIG-GPU-a/../../etc",
		"GPU-a,GPU-b", "GPU-a b", "GPU-a\x00", "GPU-a\n", "GPU-\x1b[31mred", "GPU-\u202ea", "GPU-<script>",
		"GPU-" + strings.Repeat("a", MaxNameLen),
	} {
		err := ValidateUUID("server.gpus[0].uuid", bad)
		if err == nil || !strings.HasPrefix(err.Error(), "server.gpus[0].uuid ") {
			t.Errorf("ValidateUUID(%q) = %v; want a refusal naming the field", bad, err)
			continue
		}
		if strings.ContainsAny(err.Error(), "\x00\n\x1b\u202e") {
			t.Errorf("ValidateUUID(%q): the refusal carries the raw bytes: %q", bad, err)
		}
	}
}

func TestValidateModelTakesPrintableText(t *testing.T) {
	for _, ok := range []string{"H100", "NVIDIA H100 80GB HBM3", "Tesla T4", "A100-SXM4-40GB", "GeForce RTX™ 4090"} {
		if err := ValidateModel("server.gpus[0].model", ok); err != nil {
			t.Errorf("ValidateModel(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "H100\x00", "H100\nforged line", "\x1b[2JH100", "H\u202e001", "H100\t", "\xff\xfe", strings.Repeat("H", MaxNameLen+1)} {
		err := ValidateModel("server.gpus[0].model", bad)
		if err == nil || !strings.HasPrefix(err.Error(), "server.gpus[0].model ") {
			t.Errorf("ValidateModel(%q) = %v; want a refusal naming the field", bad, err)
		}
	}
}

package app

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gpupool/gpupool/internal/cli/clitest"

	"github.com/gpupool/gpupool/inventory"
)

// TestOptionsValidate: every flag Validate refuses is named with its
// value, the simulated GPUs' flags are checked for the simulated source
// only, and the defaults pass.
func TestOptionsValidate(t *testing.T) {
	workload := filepath.Join(t.TempDir(), "workload.yaml")
	if err := os.WriteFile(workload, []byte("- {namespace: ml, selector: app=train, gpus: 1.5}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	clitest.CheckValidate(t, NewOptions, []clitest.Case{
		{nil, ""},
		{[]string{"--source", "dcgm"}, ""},
		{[]string{"--source", "nvidia-smi"}, `--source "nvidia-smi" is not one of simulated, nvml, dcgm`},
		{[]string{"--source", "nvml", "--simulated-device-dir", "/dev/gpupool"}, "--simulated-device-dir needs --source simulated"},
		{[]string{"--simulated-device-dir", "/dev/gpupool"}, ""},
		{[]string{"--interval", "0s"}, "--interval 0s: must be more than 0"},
		{[]string{"--heartbeat", "-1s"}, "--heartbeat -1s: must be more than 0"},
		{[]string{"--simulate-gpus", "H100:80Gi"}, `--simulate-gpus: simulated GPUs "H100:80Gi": "H100:80Gi" is not model:memory:count`},
		{[]string{"--simulate-gpus", "T4:16Gi:65"}, `--simulate-gpus: simulated GPUs "T4:16Gi:65": count "65" out of range 1..64`},
		{[]string{"--source", "nvml", "--simulate-gpus", "H100:80Gi"}, ""}, // not simulated: not read
		{[]string{"--simulate-topology", "ring"}, `--simulate-topology: simulated topology "ring" is not one of nvswitch, pcie, none`},
		{[]string{"--simulated-workload", workload}, ""},
		{[]string{"--simulated-workload", workload + ".missing"}, "--simulated-workload: open " + workload + ".missing: no such file or directory"},
	})
}

// TestOptionsParseTheSimulatedGPUs: Validate gives the simulated GPUs and
// their links as the flags say.
func TestOptionsParseTheSimulatedGPUs(t *testing.T) {
	o := NewOptions()
	if err := clitest.Parse(t, o, "--simulate-gpus", "L40S:48Gi:4", "--simulate-topology", "pcie"); err != nil {
		t.Fatal(err)
	}
	if len(o.simulatedGPUs) != 4 || o.simulatedGPUs[3].Model != "L40S" || o.simulatedGPUs[3].MemoryBytes != 48<<30 {
		t.Errorf("GPUs = %+v, want 4 L40S of 48 GiB", o.simulatedGPUs)
	}
	if len(o.simulatedTopology) != 4 || o.simulatedTopology[0][1] != inventory.LinkPCIeSwitch || o.simulatedTopology[0][3] != inventory.LinkSocket {
		t.Errorf("topology = %v, want pcie: 0-1 behind a switch, 0-3 on a socket", o.simulatedTopology)
	}
}

package app

import (
	"testing"

	"github.com/gpupool/gpupool/internal/cli/clitest"

	"github.com/gpupool/gpupool/kube"
)

// TestOptionsValidate: every flag Validate refuses is named with its
// value, and what it parses is kept.
func TestOptionsValidate(t *testing.T) {
	tlsFlags := []string{"--tls-cert-file", "c.pem", "--tls-private-key-file", "k.pem"}
	clitest.CheckValidate(t, NewOptions, []clitest.Case{
		{tlsFlags, ""},
		{nil, "--tls-cert-file and --tls-private-key-file are required: kube-apiserver calls webhooks over HTTPS only"},
		{[]string{"--tls-cert-file", "c.pem"}, "--tls-cert-file and --tls-private-key-file are required"},
		{append([]string{"--unit", "GPU"}, tlsFlags...), `--unit: unit "GPU": must be one of percent, gpus, memory:<size>`},
		{append([]string{"--gpu-memory", "lots"}, tlsFlags...), `--gpu-memory: "lots" is not a quantity (e.g. 8000, 8000M or 16Gi)`},
	})

	o := NewOptions()
	o.CertFile, o.KeyFile, o.UnitName, o.GPUMemory = "c.pem", "k.pem", "gpus", "80Gi"
	if err := o.Validate(); err != nil || o.Unit != kube.UnitGPUs || o.GPUMemoryBytes != 80<<30 {
		t.Errorf("--unit gpus --gpu-memory 80Gi: unit %v, %d bytes (%v); want gpus and %d", o.Unit, o.GPUMemoryBytes, err, int64(80<<30))
	}
}

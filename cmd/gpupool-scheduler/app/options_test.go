package app

import (
	"testing"

	"github.com/gpupool/gpupool/internal/cli/clitest"
)

// TestOptionsValidate: every flag Validate refuses is named with its
// value, and the defaults pass.
func TestOptionsValidate(t *testing.T) {
	clitest.CheckValidate(t, NewOptions, []clitest.Case{
		{nil, ""},
		{[]string{"--unit", "gpus"}, ""},
		{[]string{"--unit", "GPU"}, `--unit: unit "GPU": must be one of percent, gpus, memory:<size>`},
		{[]string{"--listen", "0.0.0.0:8474"}, "--listen 0.0.0.0:8474 is not a loopback address"},
		{[]string{"--listen", "8474"}, `--listen "8474"`},
		{[]string{"--listen", "127.0.0.1:8474"}, ""},
		{[]string{"--tls-cert-file", "c.pem"}, "they need --listen"},
		{[]string{"--listen", "127.0.0.1:8474", "--tls-cert-file", "c.pem"}, "--tls-cert-file and --tls-private-key-file go together"},
		{[]string{"--resync", "0s"}, "--resync 0s: must be more than 0"},
		{[]string{"--unbound-lease-timeout", "-1s"}, "--unbound-lease-timeout -1s: must be more than 0"},
		{[]string{"--resync-unbound-lease-timeout", "0s"}, "--resync-unbound-lease-timeout 0s: must be more than 0"},
		{[]string{"--kube-api-qps", "0"}, "--kube-api-qps 0: must be more than 0"},
		{[]string{"--kube-api-burst", "0"}, "--kube-api-burst 0: must be at least 1"},
		{[]string{"--allocator", " "}, "--allocator: no address"},
		{[]string{"--leader-elect-namespace", ""}, "--leader-elect-namespace: empty, while --leader-elect is on"},
		{[]string{"--leader-elect=false", "--leader-elect-namespace", ""}, ""},
	})
}

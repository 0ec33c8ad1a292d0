package main

import (
	"crypto/x509"
	"io"
	"testing"

	"github.com/gpupool/gpupool/cmd/gpupool-webhook/app"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/cli/clitest"

	"github.com/gpupool/gpupool/internal/testcert"
)

func TestHelp(t *testing.T) {
	clitest.CheckHelp(t, run, "POST /mutate", "reinvocationPolicy IfNeeded", "MutatingWebhookConfiguration", "gpupool-pod-annotations", "caBundle", "failurePolicy Fail", "-gpu-memory", "-scheduler-name")
}

func TestBadFlags(t *testing.T) {
	certFile, keyFile := testcert.WritePair(t, t.TempDir(), testcert.NewCA(t, "test CA").Issue(t, "a", x509.ExtKeyUsageServerAuth))
	tlsFlags := []string{"--tls-cert-file", certFile, "--tls-private-key-file", keyFile}
	clitest.CheckBadFlags(t, run, []clitest.Case{
		{nil, "--tls-cert-file and --tls-private-key-file are required: kube-apiserver calls webhooks over HTTPS only"},
		{append([]string{"--unit", "GPU"}, tlsFlags...), `--unit: unit \"GPU\": must be one of percent, gpus, memory:<size>`},
		{append([]string{"--gpu-memory", "lots"}, tlsFlags...), `--gpu-memory: \"lots\" is not a quantity (e.g. 8000, 8000M or 16Gi)`},
		{[]string{"--tls-cert-file", keyFile, "--tls-private-key-file", keyFile}, "the serving certificate"},
	})
}

// run is the binary's command line on args.
func run(args []string, stdout, stderr io.Writer) int {
	return cli.Main(app.Command(), args, stdout, stderr)
}

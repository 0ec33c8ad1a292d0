package main

import (
	"bytes"
	"crypto/x509"
	"strings"
	"testing"

	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/testcert"
)

func TestHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--help"}, &stdout, &stderr); code != 0 || stderr.Len() != 0 {
		t.Fatalf("--help: exit %d, stderr %q", code, stderr.String())
	}
	for _, want := range []string{"POST /mutate", "reinvocationPolicy IfNeeded", "MutatingWebhookConfiguration", "gpupool-pod-annotations", "caBundle", "failurePolicy Fail", "-gpu-memory", "-scheduler-name"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("--help does not say %q", want)
		}
	}
}

func TestBadFlags(t *testing.T) {
	certFile, keyFile := testcert.WritePair(t, t.TempDir(), testcert.NewCA(t, "test CA").Issue(t, "a", x509.ExtKeyUsageServerAuth))
	tlsFlags := []string{"--tls-cert-file", certFile, "--tls-private-key-file", keyFile}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--tls-cert-file and --tls-private-key-file are required: kube-apiserver calls webhooks over HTTPS only"},
		{append([]string{"--unit", "GPU"}, tlsFlags...), `--unit: unit \"GPU\": must be one of percent, gpus`},
		{append([]string{"--gpu-memory", "lots"}, tlsFlags...), `--gpu-memory: \"lots\" is not a quantity (e.g. 8000, 8000M or 16Gi)`},
		{[]string{"--tls-cert-file", keyFile, "--tls-private-key-file", keyFile}, "the serving certificate"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(tc.args, &stdout, &stderr); code != cli.ExitUsage || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: exit %d, %s; want %d and %q", tc.args, code, stderr.String(), cli.ExitUsage, tc.want)
		}
	}
}

package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gpupool/gpupool/internal/cli"
)

// TestHelp: --help says what the adapter serves and lists its own flags
// and custom-metrics-apiserver's, in pflag's form.
func TestHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if exit := run([]string{"--help"}, &stdout, &stderr); exit != 0 || stderr.Len() != 0 {
		t.Fatalf("--help: exit %d, stderr %q", exit, stderr.String())
	}
	for _, want := range []string{"external.metrics.k8s.io/v1beta1", "bitfusion_gpu_utilization", "never a zero", "\nFlags:\n",
		"--backend string", "--max-age duration", "--no-delegation", "--allocator-ca-file", "--secure-port int", "--authentication-kubeconfig"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("--help does not say %q", want)
		}
	}
}

// TestBadFlags: a bad command line ends with cli.ExitUsage and says why,
// whether pflag, the options' validation or Run finds it (app's tests have
// every case).
func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--nope"}, "unknown flag: --nope"},
		{[]string{"--max-age", "0s"}, "--max-age=0s must be above 0"},
		{[]string{"--allocator", "allocator:8470"}, `--allocator: allocator address \"allocator:8470\" is not a URL`},
	} {
		var stderr bytes.Buffer
		if exit := run(tc.args, &bytes.Buffer{}, &stderr); exit != cli.ExitUsage || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: exit %d, logged %s; want %d and %q", tc.args, exit, stderr.String(), cli.ExitUsage, tc.want)
		}
	}
}

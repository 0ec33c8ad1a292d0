package main

import (
	"io"
	"testing"

	"github.com/gpupool/gpupool/cmd/gpupool-adapter/app"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/cli/clitest"
)

// TestHelp: --help says what the adapter serves and lists its own flags
// and custom-metrics-apiserver's, in pflag's form.
func TestHelp(t *testing.T) {
	clitest.CheckHelp(t, run, "external.metrics.k8s.io/v1beta1", "bitfusion_gpu_utilization", "never a zero", "\nFlags:\n",
		"--backend string", "--max-age duration", "--no-delegation", "--allocator-ca-file", "--secure-port int", "--authentication-kubeconfig")
}

// TestBadFlags: a bad command line ends with cli.ExitUsage and says why,
// whether pflag, the options' validation or Run finds it (app's tests have
// every case).
func TestBadFlags(t *testing.T) {
	clitest.CheckBadFlags(t, run, []clitest.Case{
		{[]string{"--nope"}, "unknown flag: --nope"},
		{[]string{"--max-age", "0s"}, "--max-age=0s must be above 0"},
		{[]string{"--allocator", "allocator:8470"}, `--allocator: allocator address \"allocator:8470\" is not a URL`},
	})
}

// run is the binary's command line on args.
func run(args []string, stdout, stderr io.Writer) int {
	return cli.MainPflag(app.Command(), args, stdout, stderr)
}

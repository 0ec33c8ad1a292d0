package main

import (
	"io"
	"testing"

	"github.com/gpupool/gpupool/cmd/gpupool-device-plugin/app"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/cli/clitest"
)

// TestHelp: --help says what the kubelet gets, how the pod is found, what
// a container gets and what the node needs.
func TestHelp(t *testing.T) {
	clitest.CheckHelp(t, run, "bitfusion.io/gpu", "100 devices per GPU", "heart-beating", "kubelet.sock", "gpupool.io/lease",
		"first bound", "gpupool.io/allocated", "NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "pod-resources",
		"default runtime", "-plugin-dir", "-mps-pipe-dir", "-token-file", "-poll")
}

// TestBadFlags: a bad command line ends with cli.ExitUsage and says why,
// whether the options' validation or Run finds it (app's tests have every
// case).
func TestBadFlags(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	clitest.CheckBadFlags(t, run, []clitest.Case{
		{nil, "--node is required (or NODE_NAME)"},
		{[]string{"--node", "gpu-0", "--allocator", "allocator:8470"}, `--allocator: allocator address \"allocator:8470\" is not a URL`},
		{[]string{"--node", "gpu-0", "--log-level", "loud"}, `--log-level "loud": want debug`},
	})
}

// run is the binary's command line on args.
func run(args []string, stdout, stderr io.Writer) int {
	return cli.Main(app.Command(), args, stdout, stderr)
}

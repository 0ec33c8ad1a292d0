package main

import (
	"io"
	"testing"

	"github.com/gpupool/gpupool/cmd/gpupool-server/app"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/cli/clitest"
)

// TestHelp: --help says what the daemon does, and goes to stdout.
func TestHelp(t *testing.T) {
	clitest.CheckHelp(t, run, "Usage: gpupool-server [flags]", "gpupool-server --source nvml --allocator http://allocator:8470\n\nFlags:\n",
		"-simulate-topology", "-process-socket", "-log-level")
}

// TestBadFlags: a bad command line ends with cli.ExitUsage before the
// daemon starts anything, and says why.
func TestBadFlags(t *testing.T) {
	clitest.CheckBadFlags(t, run, []clitest.Case{
		// Device files stand for simulated GPUs only.
		{[]string{"--source", "nvml", "--simulated-device-dir", t.TempDir()}, "--simulated-device-dir needs --source simulated"},
		{[]string{"--listen", "127.0.0.1:0", "--simulate-topology", "ring"}, `--simulate-topology: simulated topology \"ring\" is not one of nvswitch, pcie, none`},
		{[]string{"--listen", "127.0.0.1:0", "--allocator", "allocator:8470"}, `--allocator: allocator address \"allocator:8470\" is not a URL`},
	})
}

// run is the binary's command line on args.
func run(args []string, stdout, stderr io.Writer) int {
	return cli.Main(app.Command(), args, stdout, stderr)
}

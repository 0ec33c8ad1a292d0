package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gpupool/gpupool/internal/cli"
)

// TestHelp: --help says what the daemon does, and goes to stdout.
func TestHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if exit := run([]string{"--help"}, &stdout, &stderr); exit != 0 || stderr.Len() != 0 {
		t.Fatalf("--help: exit %d, stderr %q", exit, stderr.String())
	}
	for _, want := range []string{"Usage: gpupool-server [flags]", "gpupool-server --source nvml --allocator http://allocator:8470\n\nFlags:\n",
		"-simulate-topology", "-process-socket", "-log-level"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("--help does not say %q", want)
		}
	}
}

// TestBadFlags: a bad command line ends with cli.ExitUsage before the
// daemon starts anything, and says why.
func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		// Device files stand for simulated GPUs only.
		{[]string{"--source", "nvml", "--simulated-device-dir", t.TempDir()}, "--simulated-device-dir needs --source simulated"},
		{[]string{"--listen", "127.0.0.1:0", "--simulate-topology", "ring"}, `--simulate-topology: simulated topology \"ring\" is not one of nvswitch, pcie, none`},
		{[]string{"--listen", "127.0.0.1:0", "--allocator", "allocator:8470"}, `--allocator: allocator address \"allocator:8470\" is not a URL`},
	} {
		var stderr bytes.Buffer
		if exit := run(tc.args, &bytes.Buffer{}, &stderr); exit != cli.ExitUsage || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: exit %d, logged %s; want %d and %q", tc.args, exit, stderr.String(), cli.ExitUsage, tc.want)
		}
	}
}

package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gpupool/gpupool/internal/cli"
)

// TestHelp: --help says how kube-scheduler must call the extender and how
// it is served.
func TestHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if exit := run([]string{"--help"}, &stdout, &stderr); exit != 0 || stderr.Len() != 0 {
		t.Fatalf("--help: exit %d, stderr %q", exit, stderr.String())
	}
	for _, want := range []string{"filterVerb", "bindVerb bind", "nodeCacheCapable true", "ignoredByScheduler: true",
		"percentageOfNodesToScore 100", "loopback", "-client-ca-file", "lease controller", "-unit", "-resync"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("--help does not say %q", want)
		}
	}
}

// TestBadFlags: a bad command line ends with cli.ExitUsage and says why.
func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "0.0.0.0:8474"}, "is not a loopback address"},
		{[]string{"--unit", "GPU"}, `--unit: unit \"GPU\": must be one of percent, gpus`},
		{[]string{"--allocator", "allocator:8470"}, `--allocator: allocator address \"allocator:8470\" is not a URL`},
	} {
		var stderr bytes.Buffer
		if exit := run(tc.args, &bytes.Buffer{}, &stderr); exit != cli.ExitUsage || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: exit %d, logged %s; want %d and %q", tc.args, exit, stderr.String(), cli.ExitUsage, tc.want)
		}
	}
}

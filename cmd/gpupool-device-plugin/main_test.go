package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gpupool/gpupool/internal/cli"
)

// TestHelp: --help says what the kubelet gets, how the pod is found, what
// a container gets and what the node needs.
func TestHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if exit := run([]string{"--help"}, &stdout, &stderr); exit != 0 || stderr.Len() != 0 {
		t.Fatalf("--help: exit %d, stderr %q", exit, stderr.String())
	}
	for _, want := range []string{"bitfusion.io/gpu", "100 devices per GPU", "heart-beating", "kubelet.sock", "gpupool.io/lease",
		"first bound", "gpupool.io/allocated", "NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "pod-resources",
		"default runtime", "-plugin-dir", "-mps-pipe-dir", "-token-file", "-poll"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("--help does not say %q", want)
		}
	}
}

// TestBadFlags: a bad command line ends with cli.ExitUsage and says why,
// whether the options' validation or Run finds it (app's tests have every
// case).
func TestBadFlags(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--node is required (or NODE_NAME)"},
		{[]string{"--node", "gpu-0", "--allocator", "allocator:8470"}, `--allocator: allocator address \"allocator:8470\" is not a URL`},
		{[]string{"--node", "gpu-0", "--log-level", "loud"}, `--log-level "loud": want debug`},
	} {
		var stderr bytes.Buffer
		if exit := run(tc.args, &bytes.Buffer{}, &stderr); exit != cli.ExitUsage || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: exit %d, logged %s; want %d and %q", tc.args, exit, stderr.String(), cli.ExitUsage, tc.want)
		}
	}
}

package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gpupool/gpupool/internal/cli"
)

// TestHelp: --help says what the allocator does and how to check a store.
func TestHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if exit := run([]string{"--help"}, &stdout, &stderr); exit != 0 || stderr.Len() != 0 {
		t.Fatalf("--help: exit %d, stderr %q", exit, stderr.String())
	}
	for _, want := range []string{"durable (fsync)", "gpupool-allocator --check --data-dir /var/lib/gpupool", "-etcd-endpoints", "-insecure-http", "-max-waiting-per-namespace"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("--help does not say %q", want)
		}
	}
}

// TestBadFlags: a bad command line ends with cli.ExitUsage and says why,
// served or checked.
func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--store", "sqlite"}, `msg="bad flag" err="--store \"sqlite\" is not one of bolt, etcd"`},
		{[]string{"--listen", "0.0.0.0:8470"}, "--listen 0.0.0.0:8470 is not a loopback address"},
		{[]string{"--listen", "127.0.0.1:0", "--config", "/nonexistent/gpupool.yaml"}, "--config: open /nonexistent/gpupool.yaml"},
		{[]string{"--check", "--store", "sqlite", "--listen", "0.0.0.0:8470"}, "gpupool-allocator: --store \"sqlite\" is not one of bolt, etcd\n"},
	} {
		var stderr bytes.Buffer
		if exit := run(tc.args, &bytes.Buffer{}, &stderr); exit != cli.ExitUsage || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: exit %d, said %s; want %d and %q", tc.args, exit, stderr.String(), cli.ExitUsage, tc.want)
		}
	}
}

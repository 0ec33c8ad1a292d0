package main

import (
	"io"
	"testing"

	"github.com/gpupool/gpupool/cmd/gpupool-allocator/app"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/cli/clitest"
)

// TestHelp: --help says what the allocator does and how to check a store.
func TestHelp(t *testing.T) {
	clitest.CheckHelp(t, run, "durable (fsync)", "gpupool-allocator --check --data-dir /var/lib/gpupool", "-etcd-endpoints", "-insecure-http", "-max-waiting-per-namespace")
}

// TestBadFlags: a bad command line ends with cli.ExitUsage and says why,
// served or checked.
func TestBadFlags(t *testing.T) {
	clitest.CheckBadFlags(t, run, []clitest.Case{
		{[]string{"--store", "sqlite"}, `msg="bad flag" err="--store \"sqlite\" is not one of bolt, etcd"`},
		{[]string{"--listen", "0.0.0.0:8470"}, "--listen 0.0.0.0:8470 is not a loopback address"},
		{[]string{"--listen", "127.0.0.1:0", "--config", "/nonexistent/gpupool.yaml"}, "--config: open /nonexistent/gpupool.yaml"},
		{[]string{"--check", "--store", "sqlite", "--listen", "0.0.0.0:8470"}, "gpupool-allocator: --store \"sqlite\" is not one of bolt, etcd\n"},
	})
}

// run is the binary's command line on args.
func run(args []string, stdout, stderr io.Writer) int {
	return cli.Main(app.Command(), args, stdout, stderr)
}

package main

import (
	"io"
	"testing"

	"github.com/gpupool/gpupool/cmd/gpupool-scheduler/app"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/cli/clitest"
)

// TestHelp: --help says what runs (the lease controller, the quotas,
// leader election), the subcommands, and, for the extender with --listen,
// how kube-scheduler must call it and how it is served.
func TestHelp(t *testing.T) {
	clitest.CheckHelp(t, run, "lease controller", "ResourceQuotas", "-leader-elect", "secrets", "resume", "only with --listen",
		"filterVerb", "bindVerb bind", "nodeCacheCapable true", "ignoredByScheduler: true",
		"percentageOfNodesToScore 100", "loopback", "-client-ca-file", "-unit", "-resync")
}

// TestBadFlags: a bad command line ends with cli.ExitUsage and says why.
func TestBadFlags(t *testing.T) {
	clitest.CheckBadFlags(t, run, []clitest.Case{
		{[]string{"--listen", "0.0.0.0:8474"}, "is not a loopback address"},
		{[]string{"--unit", "GPU"}, `--unit: unit \"GPU\": must be one of percent, gpus, memory:<size>`},
		{[]string{"--allocator", "allocator:8470"}, `--allocator: allocator address \"allocator:8470\" is not a URL`},
	})
}

// run is the binary's command line on args.
func run(args []string, stdout, stderr io.Writer) int {
	return cli.Main(app.Command(), args, stdout, stderr)
}

// TestSecretsHelp: `gpupool-scheduler secrets --help` says what it makes,
// and a bad command line is refused naming the flag.
func TestSecretsHelp(t *testing.T) {
	secrets := func(args []string, stdout, stderr io.Writer) int {
		return cli.Main(app.SecretsCommand(), args, stdout, stderr)
	}
	clitest.CheckHelp(t, secrets, "gpupool-tokens", "reader-token", "gpupool-allocator-config", "gpupool-ca", "caBundle", "gpupool-keda-client")
	clitest.CheckBadFlags(t, secrets, []clitest.Case{
		{[]string{"--allocator-namespaces", "[1]"}, "--allocator-namespaces"},
		{[]string{"--keda-namespace", "gpupool"}, "--keda-namespace=gpupool is --namespace"},
		{[]string{"--keda-wait", "0s"}, "--keda-wait=0s"},
	})
}

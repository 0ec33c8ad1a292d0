// Command gpupool is the GPU pool's command-line tool.
package main

import (
	"fmt"
	"io"
	"os"
)

const usage = `gpupool: a GPU pool with fractional GPUs, quotas and leases.

Usage:
  gpupool <command> [flags]

Commands:
  run          run a command on pooled GPUs: gpupool run -n 1 -p 50 -- python3 train.py
  pool status  the pool's servers and GPUs, leased share and health
  leases       live leases: who holds which share of which GPU
  quota        GPU quota and use per namespace
  simulate     replay an OpenB GPU trace against the placement policies

Run "gpupool <command> --help" for a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes a command and returns the process exit status: 0 on
// success, 1 when the work failed, 2 on bad usage.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "simulate":
		return simulateCmd(args[1:], stdout, stderr)
	case "run":
		return runCmd(args[1:], stdout, stderr)
	case "pool":
		return poolCmd(args[1:], stdout, stderr)
	case "leases":
		return leasesCmd(args[1:], stdout, stderr)
	case "quota":
		return quotaCmd(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "gpupool: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}

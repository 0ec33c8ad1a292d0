// Command gpupool is the GPU pool's command-line tool.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/gpupool/gpupool/internal/cli"
)

const usage = `gpupool: a GPU pool with fractional GPUs, quotas and leases.

Usage:
  gpupool <command> [flags]

Commands:
  run          run a command on pooled GPUs: gpupool run -n 1 -p 50 -- python3 train.py
  pool status  the pool's servers and GPUs, leased share and health
  leases       live leases: who holds which share of which GPU
  quota        GPU quota and use per namespace
  resume       on Kubernetes, undo what an idle policy reclaimed:
               gpupool resume job/train -n ml
               (runs gpupool-scheduler resume, which speaks to kube-apiserver)
  simulate     replay an OpenB GPU trace against the placement policies
               (runs gpupool-simulate, a binary of its own)

Run "gpupool <command> --help" for a command's flags.

Exit statuses: 0 done, 1 failed, 2 bad usage, 69 allocator unreachable,
75 no capacity now, 77 quota exceeded or not allowed; run passes on its
command's own and simulate on gpupool-simulate's, each 127 where that
command cannot be started.
`

// Exit statuses when a command did not do its work, after sysexits.h, so
// that scripts can tell "fix the call" from "try later" from "not allowed".
const (
	exitFailed      = 1
	exitUsage       = cli.ExitUsage
	exitUnavailable = 69  // the allocator cannot be reached, or cannot serve
	exitNoCapacity  = 75  // no capacity now: retry later or pass --wait
	exitNoPermit    = 77  // quota exceeded, or the token may not act here
	exitNotFound    = 127 // the command to run cannot be started, as a shell says
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes a command and returns the process exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "simulate":
		return simulateTool.run(args[1:], stdout, stderr)
	case "run":
		return runCmd(args[1:], stdout, stderr)
	case "pool":
		return poolCmd(args[1:], stdout, stderr)
	case "leases":
		return leasesCmd(args[1:], stdout, stderr)
	case "quota":
		return quotaCmd(args[1:], stdout, stderr)
	case "resume":
		return resumeTool.run(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "gpupool: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
}

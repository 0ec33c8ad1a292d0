// Command gpupool-demo runs the whole pool on this machine, no cluster and
// no GPU: the allocator, simulated GPU servers, the external-metrics
// adapter and a workload, with a live view. `make demo` runs it.
//
// The files split it by concern: wiring.go starts the parts, each its
// binary's app.Run; workload.go is the synthetic tenants; view.go draws
// the terminal frame from the parts' HTTP APIs; tokens.go writes the
// allocator's config and the parts' tokens.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gpupool/gpupool/internal/cli"
)

// usage is what --help says above the flags.
const usage = `Usage: gpupool-demo [flags]

Runs the whole pool on this machine, no cluster and no GPU: the allocator
(embedded store in a temp dir), simulated GPU servers with mixed models
(each a real gpupool-server daemon on the simulated source), and a workload:
a training group (app=tf-training in namespace ml) whose load rises and
falls, and other tenants taking fractional leases. Tokens are on, as
deployed: the allocator's config in the temp dir has random tokens for an
admin, the GPU servers and each namespace, and each part holds its own.
Prints where each /metrics is and how to use the tokens, then a live view
every second.

Flags:
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the demo and returns the process exit status: 0 when it ran
// its time or was stopped, 1 when it failed, 2 on bad usage.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpupool-demo", flag.ContinueOnError)
	duration := fs.Duration("duration", 0, "how long to run; 0 runs until Ctrl-C")
	refresh := fs.Duration("refresh", time.Second, "time between views")
	seed := fs.Uint64("seed", 1, "seed of the simulated GPUs and the workload")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if exit, ok := cli.Parse(fs, args, stdout, stderr); !ok {
		return exit
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	d, err := startDemo(ctx, *seed)
	if errors.Is(err, context.Canceled) {
		return 0 // stopped while starting
	}
	if err != nil {
		fmt.Fprintln(stderr, "gpupool-demo:", err)
		return 1
	}
	defer d.close()
	d.startWorkload(newWorkload(d.tenants, *seed, d.log), time.Second)
	self, _ := os.Executable()
	wd, _ := os.Getwd()
	if err := d.show(ctx, stdout, clientCommand(self, wd), *refresh); err != nil {
		fmt.Fprintln(stderr, "gpupool-demo:", err)
		return 1
	}
	fmt.Fprintf(stdout, "gpupool-demo: stopped; the log stays in %s\n", d.logFile)
	return 0
}

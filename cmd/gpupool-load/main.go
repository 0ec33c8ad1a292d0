// Command gpupool-load plays many GPU servers and clients against a
// running allocator (and adapter) to measure how it holds up (app): it is
// an operator's tool, kept out of the gpupool client that every pod
// carries.
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpupool/gpupool/cmd/gpupool-load/app"
	"github.com/gpupool/gpupool/internal/cli"
)

func main() {
	// Interrupted, the load still releases its leases and sums up.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	exit := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(exit)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o := app.NewOptions()
	return cli.RunTool(ctx, cli.Tool{Name: "gpupool-load", Usage: app.Usage, Options: o,
		Run: func(ctx context.Context, stdout, _ io.Writer) error { return app.Run(ctx, o, stdout) }}, args, stdout, stderr)
}

// Command gpupool-adapter serves the GPU pool's signals to the
// HorizontalPodAutoscaler as external metrics (external.metrics.k8s.io;
// app, adapter).
package main

import (
	"context"
	"io"
	"log/slog"
	"os"

	"github.com/gpupool/gpupool/cmd/gpupool-adapter/app"
	"github.com/gpupool/gpupool/internal/cli"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the adapter's command line, on pflag: custom-metrics-apiserver's
// serving flags are pflag's.
func run(args []string, stdout, stderr io.Writer) int {
	o := app.NewOptions()
	return cli.MainPflag(cli.PflagService{Name: "gpupool-adapter", Usage: app.Usage, Options: o,
		Run: func(ctx context.Context, log *slog.Logger) error { return app.Run(ctx, o, log) }}, args, stdout, stderr)
}

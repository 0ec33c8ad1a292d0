// Command gpupool-scheduler places pods through the GPU pool: it serves
// kube-scheduler's extender and runs the controller that ends each pod's
// lease with the pod (app).
package main

import (
	"context"
	"io"
	"log/slog"
	"os"

	"github.com/gpupool/gpupool/cmd/gpupool-scheduler/app"
	"github.com/gpupool/gpupool/internal/cli"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	o := app.NewOptions()
	return cli.Main(cli.Service{Name: "gpupool-scheduler", Usage: app.Usage, Options: o,
		Run: func(ctx context.Context, log *slog.Logger) error { return app.Run(ctx, o, log) }}, args, stdout, stderr)
}

// Command gpupool-webhook is gpupool's admission webhook for pods that ask
// for GPUs from the pool (kube/admission), served over HTTPS (app).
package main

import (
	"context"
	"io"
	"log/slog"
	"os"

	"github.com/gpupool/gpupool/cmd/gpupool-webhook/app"
	"github.com/gpupool/gpupool/internal/cli"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	o := app.NewOptions()
	return cli.Main(cli.Service{Name: "gpupool-webhook", Usage: app.Usage, Options: o,
		Run: func(ctx context.Context, log *slog.Logger) error { return app.Run(ctx, o, log) }}, args, stdout, stderr)
}

// Command gpupool-server is the GPU-server daemon: one per GPU host (app).
package main

import (
	"context"
	"io"
	"log/slog"
	"os"

	"github.com/gpupool/gpupool/cmd/gpupool-server/app"
	"github.com/gpupool/gpupool/internal/cli"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	o := app.NewOptions()
	return cli.Main(cli.Service{Name: "gpupool-server", Usage: app.Usage, Options: o,
		Run: func(ctx context.Context, log *slog.Logger) error { return app.Run(ctx, o, log) }}, args, stdout, stderr)
}

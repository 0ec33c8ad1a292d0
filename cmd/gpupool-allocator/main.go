// Command gpupool-allocator serves the GPU pool's allocator over HTTP
// (app), or checks its store (--check).
package main

import (
	"context"
	"io"
	"log/slog"
	"os"

	"github.com/gpupool/gpupool/cmd/gpupool-allocator/app"
	"github.com/gpupool/gpupool/internal/cli"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	o := app.NewOptions()
	return cli.Main(cli.Service{Name: "gpupool-allocator", Usage: app.Usage, Options: o,
		OneShot: func(stdout, stderr io.Writer) (int, bool) { return app.Check(o, stdout, stderr) },
		Run:     func(ctx context.Context, log *slog.Logger) error { return app.Run(ctx, o, log) }}, args, stdout, stderr)
}

// Command gpupool-device-plugin is the kubelet device plugin of a GPU
// server: it advertises bitfusion.io/gpu on its node and gives each
// container that asks the GPUs of its pod's lease (app, kube/deviceplugin).
package main

import (
	"context"
	"io"
	"log/slog"
	"os"

	"github.com/gpupool/gpupool/cmd/gpupool-device-plugin/app"
	"github.com/gpupool/gpupool/internal/cli"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	o := app.NewOptions()
	return cli.Main(cli.Service{Name: "gpupool-device-plugin", Usage: app.Usage, Options: o,
		Run: func(ctx context.Context, log *slog.Logger) error { return app.Run(ctx, o, log) }}, args, stdout, stderr)
}

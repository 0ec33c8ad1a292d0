// Command gpupool-simulate replays Alibaba's OpenB GPU traces against the
// placement policies (app). It is an operator's tool, kept out of the
// gpupool client that every pod carries, which runs it as
// `gpupool simulate`.
package main

import (
	"context"
	"io"
	"os"

	"github.com/gpupool/gpupool/cmd/gpupool-simulate/app"
	"github.com/gpupool/gpupool/internal/cli"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	tool, args := app.Command(args)
	// A replay has nothing to clean up: a signal ends it at once.
	return cli.RunTool(context.Background(), tool, args, stdout, stderr)
}

// Package app is gpupool-simulate: the replay of Alibaba's OpenB GPU
// traces against the placement policies (the replay itself is package
// simulate), and its grid and sharing commands, each an Options and a Run.
package app

import (
	"context"
	"io"
	"os"

	"github.com/gpupool/gpupool/internal/cli"
)

// Command is the command args name, the rest of args its flags: grid or
// sharing when args begin with one, else the replay.
func Command(args []string) (cli.Tool, []string) {
	if len(args) > 0 {
		switch args[0] {
		case "grid":
			o := &GridOptions{}
			return cli.Tool{Name: "gpupool-simulate grid", Usage: GridUsage, Options: o,
				Run: func(_ context.Context, stdout, stderr io.Writer) error { return RunGrid(o, stdout, stderr) }}, args[1:]
		case "sharing":
			o := &SharingOptions{}
			return cli.Tool{Name: "gpupool-simulate sharing", Usage: SharingUsage, Options: o,
				Run: func(_ context.Context, stdout, stderr io.Writer) error { return RunSharing(o, stdout, stderr) }}, args[1:]
		}
	}
	o := &ReplayOptions{}
	return cli.Tool{Name: "gpupool-simulate", Usage: ReplayUsage, Options: o,
		Run: func(_ context.Context, stdout, stderr io.Writer) error { return RunReplay(o, stdout, stderr) }}, args
}

// Main is gpupool-simulate's main.
func Main() { os.Exit(Exec(os.Args[1:], os.Stdout, os.Stderr)) }

// Exec runs gpupool-simulate's command line on args and returns its exit
// status.
func Exec(args []string, stdout, stderr io.Writer) int {
	tool, args := Command(args)
	// A replay has nothing to clean up: a signal ends it at once.
	return cli.RunTool(context.Background(), tool, args, stdout, stderr)
}

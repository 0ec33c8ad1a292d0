package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
)

// simulateBinary is what `gpupool simulate` runs. The trace replay is a
// binary of its own so that the client, copied into every pod, carries
// neither it nor its 2 MB of embedded traces; operators and the Makefile
// run it, and users who know it as a command of gpupool still can.
const simulateBinary = "gpupool-simulate"

// simulateCmd runs gpupool-simulate with args as kubectl runs a plugin,
// its output and exit status the command's own; signals that reach gpupool
// are passed on to it.
func simulateCmd(args []string, stdout, stderr io.Writer) int {
	dir := ""
	if self, err := os.Executable(); err == nil {
		dir = filepath.Dir(self)
	}
	path, err := findSimulate(dir)
	if err != nil {
		fmt.Fprintf(stderr, "gpupool simulate: %s, the trace replay, is neither beside gpupool nor on PATH\n"+
			"  build it with make build (bin/%[1]s) or go install ./cmd/%[1]s, or run it from the gpupool/gpupool image\n", simulateBinary)
		return exitNotFound
	}
	cmd := exec.Command(path, args...) //nolint:gosec // the replay binary, found as findSimulate says
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(signals)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "gpupool simulate:", err)
		return exitNotFound
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for {
		select {
		case sig := <-signals:
			_ = cmd.Process.Signal(sig)
		case err := <-exited:
			return exitStatus(err)
		}
	}
}

// findSimulate is gpupool-simulate's path: the one in dir, gpupool's own
// directory (empty: unknown), which came with the same build, else the
// first on PATH.
func findSimulate(dir string) (string, error) {
	if dir != "" {
		if path, err := exec.LookPath(filepath.Join(dir, simulateBinary)); err == nil {
			return path, nil
		}
	}
	return exec.LookPath(simulateBinary)
}

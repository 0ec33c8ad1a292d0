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

// A tool is a command of gpupool that is a binary of its own, so that
// the client, copied into every pod, carries neither the trace replay
// and its 2 MB of embedded traces nor the Kubernetes client (27 MB).
// Operators and the Makefile run them; users who know them as commands
// of gpupool still can.
type tool struct {
	command string   // gpupool's command: simulate
	binary  string   // what it runs: gpupool-simulate
	args    []string // before the command's own: resume
	what    string   // what the binary is, for the error that finds none
}

var (
	simulateTool = tool{command: "simulate", binary: "gpupool-simulate", what: "the trace replay"}
	resumeTool   = tool{command: "resume", binary: "gpupool-scheduler", args: []string{"resume"}, what: "which speaks to kube-apiserver"}
)

// run runs the tool's binary with args as kubectl runs a plugin, its
// output and exit status the command's own; signals that reach gpupool
// are passed on to it.
func (tl tool) run(args []string, stdout, stderr io.Writer) int {
	dir := ""
	if self, err := os.Executable(); err == nil {
		dir = filepath.Dir(self)
	}
	path, err := tl.find(dir)
	if err != nil {
		fmt.Fprintf(stderr, "gpupool %s: %s, %s, is neither beside gpupool nor on PATH\n"+
			"  build it with make build (bin/%[2]s) or go install ./cmd/%[2]s, or run it from the gpupool/gpupool image\n", tl.command, tl.binary, tl.what)
		return exitNotFound
	}
	cmd := exec.Command(path, append(tl.args[:len(tl.args):len(tl.args)], args...)...) //nolint:gosec // gpupool's own binary, found as find says
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(signals)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "gpupool %s: %v\n", tl.command, err)
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

// find is the binary's path: the one in dir, gpupool's own directory
// (empty: unknown), which came with the same build, else the first on
// PATH.
func (tl tool) find(dir string) (string, error) {
	if dir != "" {
		if path, err := exec.LookPath(filepath.Join(dir, tl.binary)); err == nil {
			return path, nil
		}
	}
	return exec.LookPath(tl.binary)
}

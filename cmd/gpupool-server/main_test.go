package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupool/gpupool/internal/cli"
)

// TestDefaultProcessSocketOptional: a daemon that cannot create the
// default process socket (a plain user's cannot create /run/gpupool) warns
// that reports are off and how to turn them on, and goes on; one that
// cannot create the socket the user asked for fails.
func TestDefaultProcessSocketOptional(t *testing.T) {
	dir, err := os.MkdirTemp("", "gpupool")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	defer func(d string) { defaultSocketDir = d }(defaultSocketDir)
	defaultSocketDir = filepath.Join(file, "run") // under a file: no user, root included, may create it

	var logged bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	ln, path, err := listenProcessSocket(defaultProcessSocket, "gpu-a", false, log)
	if err != nil || ln != nil || path != "" {
		t.Fatalf("the default socket, not creatable: %v, %v, %q; want no socket and no error", ln, err, path)
	}
	if out := logged.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "process reports are off") || !strings.Contains(out, "--process-socket") {
		t.Errorf("logged %q, want a warning that reports are off and how to turn them on", out)
	}

	if ln, _, err := listenProcessSocket(filepath.Join(file, "run", "gpu-a.sock"), "gpu-a", true, log); err == nil {
		_ = ln.Close()
		t.Error("a socket the user asked for, not creatable: no error")
	}

	// Where it can be created, the default is taken.
	defaultSocketDir = filepath.Join(dir, "run")
	ln, path, err = listenProcessSocket(defaultProcessSocket, "gpu-a", false, log)
	if err != nil || ln == nil || path != filepath.Join(dir, "run", "gpu-a.sock") {
		t.Fatalf("the default socket, creatable: %v, %q", err, path)
	}
	_ = ln.Close()
	if ln, path, err := listenProcessSocket("", "gpu-a", true, log); ln != nil || path != "" || err != nil {
		t.Errorf("--process-socket \"\": %v, %q, %v; want no socket", ln, path, err)
	}
}

// TestDefaultNameLowercase: the default server name is the host name
// lowercased, as the kubelet names its node.
func TestDefaultNameLowercase(t *testing.T) {
	if got := defaultName("GPU-Host-7.Example.COM"); got != "gpu-host-7.example.com" {
		t.Errorf("defaultName = %q", got)
	}
}

// TestSimulatedDeviceDirNeedsTheSimulatedSource: device files stand for
// simulated GPUs only; asked for beside a real source, the daemon says so
// and stops before it starts anything.
func TestSimulatedDeviceDirNeedsTheSimulatedSource(t *testing.T) {
	var stdout, stderr bytes.Buffer
	exit := run([]string{"--source", "nvml", "--simulated-device-dir", t.TempDir()}, &stdout, &stderr)
	if exit != cli.ExitUsage || !strings.Contains(stderr.String(), "--simulated-device-dir needs --source simulated") {
		t.Errorf("exit %d, stderr %q; want %d saying it needs the simulated source", exit, stderr.String(), cli.ExitUsage)
	}
}

// TestSimulateTopologyIsOneOfTheShapes: an unknown topology stops the
// daemon before it registers, naming the shapes it knows.
func TestSimulateTopologyIsOneOfTheShapes(t *testing.T) {
	var stdout, stderr bytes.Buffer
	exit := run([]string{"--listen", "127.0.0.1:0", "--simulate-topology", "ring"}, &stdout, &stderr)
	if exit != cli.ExitUsage || !strings.Contains(stderr.String(), `--simulate-topology: simulated topology \"ring\" is not one of nvswitch, pcie, none`) {
		t.Errorf("exit %d, stderr %q; want %d naming the shapes", exit, stderr.String(), cli.ExitUsage)
	}
}

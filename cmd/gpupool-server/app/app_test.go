package app

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/fakegpu"
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

// TestProcessSocketSetOrDefault: the socket is the user's ask only when
// the flag was given, even at its default's value.
func TestProcessSocketSetOrDefault(t *testing.T) {
	for _, args := range [][]string{nil, {"--process-socket", defaultProcessSocket}} {
		o := NewOptions()
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		o.AddFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if got := o.isSet("process-socket"); got != (args != nil) {
			t.Errorf("%q: set %v", args, got)
		}
	}
}

// TestDefaultNameLowercase: the default server name is the host name
// lowercased, as the kubelet names its node.
func TestDefaultNameLowercase(t *testing.T) {
	if got := defaultName("GPU-Host-7.Example.COM"); got != "gpu-host-7.example.com" {
		t.Errorf("defaultName = %q", got)
	}
}

// TestAdvertised: clients reach a listener at the host given, else at the
// listen host, else, when it listens on every interface, at the host name.
func TestAdvertised(t *testing.T) {
	hostname, _ := os.Hostname()
	for _, tc := range []struct{ addr, host, want string }{
		{"127.0.0.1:8471", "", "127.0.0.1:8471"},
		{"127.0.0.1:8471", "gpu-a.example.com", "gpu-a.example.com:8471"},
		{"0.0.0.0:8471", "", net.JoinHostPort(hostname, "8471")},
		{"[::]:8472", "", net.JoinHostPort(hostname, "8472")},
	} {
		addr, err := net.ResolveTCPAddr("tcp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := advertised(addr, tc.host); got != tc.want {
			t.Errorf("advertised(%s, %q) = %s, want %s", tc.addr, tc.host, got, tc.want)
		}
	}
}

// TestRunStopsWhileWaitingForTheExporter: a daemon stopped while it waits
// for its dcgm-exporter stops cleanly.
func TestRunStopsWhileWaitingForTheExporter(t *testing.T) {
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }))
	defer down.Close()
	o := NewOptions()
	o.Listen, o.Source, o.DCGMURL = "127.0.0.1:0", "dcgm", down.URL
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Run(ctx, o, slog.New(slog.DiscardHandler)); err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
}

// TestRunBadCAIsTheCommandLines: an allocator CA that does not load is a
// bad flag, found before the daemon listens.
func TestRunBadCAIsTheCommandLines(t *testing.T) {
	o := NewOptions()
	o.Listen, o.AllocatorCAFile = "256.0.0.1:0", filepath.Join(t.TempDir(), "missing.pem")
	var usage *cli.UsageError
	if err := Run(context.Background(), o, slog.New(slog.DiscardHandler)); !errors.As(err, &usage) || !strings.HasPrefix(err.Error(), "--allocator-ca-file: ") {
		t.Errorf("Run = %v, want a usage error naming --allocator-ca-file", err)
	}
}

// TestRunReadsTheTokenFileGiven: options set in code name the token file
// as --token-file does, and one that does not open is a bad flag.
func TestRunReadsTheTokenFileGiven(t *testing.T) {
	o := NewOptions()
	o.Listen, o.Tokens = "256.0.0.1:0", cli.TokenFile(filepath.Join(t.TempDir(), "missing"))
	var usage *cli.UsageError
	if err := Run(context.Background(), o, slog.New(slog.DiscardHandler)); !errors.As(err, &usage) || !strings.HasPrefix(err.Error(), "--token-file: ") {
		t.Errorf("Run = %v, want a usage error naming --token-file", err)
	}
}

// TestOpenSimulatedDemand: the SimulatedDemand given drives the simulated
// GPUs, and --simulated-workload's file takes its place.
func TestOpenSimulatedDemand(t *testing.T) {
	workload := filepath.Join(t.TempDir(), "workload.yaml")
	if err := os.WriteFile(workload, []byte("[]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{"", workload} {
		o := NewOptions()
		o.SimulatedWorkload = file
		o.SimulatedDemand = func([]allocator.Lease, time.Time) map[string]float64 { return map[string]float64{"lease-a": 0.5} }
		if err := o.Validate(); err != nil {
			t.Fatal(err)
		}
		src, _, err := o.openSimulated()
		if err != nil {
			t.Fatal(err)
		}
		leases := []allocator.Lease{{ID: "lease-a"}}
		got, want := src.(*fakegpu.Source).Demand(leases, time.Time{})["lease-a"], 0.5
		if file != "" {
			want = 0
		}
		if got != want {
			t.Errorf("--simulated-workload %q: lease-a's demand %v, want %v", file, got, want)
		}
	}
}

// TestOpenSimulatedMakesDeviceFiles: with a device directory the
// simulated GPUs are files there, named by the UUIDs they register with.
func TestOpenSimulatedMakesDeviceFiles(t *testing.T) {
	o := NewOptions()
	o.Name, o.SimulateGPUs, o.SimulatedDeviceDir = "gpu-a", "T4:16Gi:2", filepath.Join(t.TempDir(), "dev")
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	src, inv, err := o.openSimulated()
	if err != nil {
		t.Fatal(err)
	}
	if src.Name() != "simulated" || inv.Name != "gpu-a" || len(inv.GPUs) != 2 {
		t.Fatalf("opened %s, inventory %+v; want 2 simulated GPUs on gpu-a", src.Name(), inv)
	}
	for _, g := range inv.GPUs {
		if _, err := os.Stat(filepath.Join(o.SimulatedDeviceDir, g.UUID)); err != nil {
			t.Errorf("GPU %d: %v", g.Index, err)
		}
	}
}

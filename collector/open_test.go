package collector

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpupool/gpupool/inventory"
)

// TestOpenDCGMWaitsForGPUs: the dcgm source waits, saying so, while its
// exporter is down or shows no GPU, then registers the GPUs it shows with
// the host's CPU.
func TestOpenDCGMWaitsForGPUs(t *testing.T) {
	fixture, err := os.ReadFile("testdata/dcgm-exporter.txt")
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		switch calls.Add(1) {
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		case 2: // up, before the GPUs are known
		default:
			_, _ = w.Write(fixture)
		}
	}))
	defer srv.Close()
	var logged bytes.Buffer
	o, err := Open(context.Background(), SourceConfig{Kind: SourceDCGM, Server: "gpu-a", CPUMilli: 64000,
		DCGMURL: srv.URL, DCGMRetry: time.Millisecond, Log: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	inv := o.Inventory
	if o.Source.Name() != "dcgm" || inv.Name != "gpu-a" || inv.CPUMilli != 64000 || len(inv.GPUs) != 2 {
		t.Errorf("opened %s, inventory %+v; want dcgm, gpu-a with 64000m CPU and the exporter's 2 GPUs", o.Source.Name(), inv)
	}
	if n := strings.Count(logged.String(), "waiting for dcgm-exporter"); n != 2 || calls.Load() != 3 {
		t.Errorf("%d calls, logged %q; want 3 calls and 2 waits", calls.Load(), logged.String())
	}
}

// TestOpenDCGMStopsWithContext: a daemon stopped while it waits for its
// exporter stops waiting, with ctx's error.
func TestOpenDCGMStopsWithContext(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	_, err := Open(ctx, SourceConfig{Kind: SourceDCGM, DCGMURL: srv.URL, DCGMRetry: time.Millisecond, Log: slog.New(slog.DiscardHandler)})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
}

// TestOpenNVML: the nvml source registers the GPUs NVML shows, and
// releases the library once closed; without the library it says what is
// missing.
func TestOpenNVML(t *testing.T) {
	idle, _ := loadNVMLFixtures(t)
	lib := mockLibrary(mockDevice(t, idle))
	var shutdowns atomic.Int32
	lib.ShutdownFunc = func() nvml.Return { shutdowns.Add(1); return nvml.SUCCESS }
	o, err := Open(context.Background(), SourceConfig{Kind: SourceNVML, Server: "gpu-a", CPUMilli: 8000, NVML: lib, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if inv := o.Inventory; o.Source.Name() != "nvml" || inv.Name != "gpu-a" || inv.CPUMilli != 8000 || len(inv.GPUs) != 1 || inv.GPUs[0].UUID != idle.UUID {
		t.Errorf("opened %s, inventory %+v; want nvml, gpu-a with 8000m CPU and GPU %s", o.Source.Name(), inv, idle.UUID)
	}
	if o.Close(); shutdowns.Load() != 1 {
		t.Errorf("closing shut NVML down %d times, want once", shutdowns.Load())
	}

	noLib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	if _, err := Open(context.Background(), SourceConfig{Kind: SourceNVML, NVML: noLib}); err == nil ||
		!strings.HasPrefix(err.Error(), "starting the NVML source: NVML: NVML Init: libnvidia-ml.so.1 not found") {
		t.Errorf("without the library: %v", err)
	}
}

// TestOpenSimulated: the simulated GPUs are what the caller opens, with
// the host's CPU.
func TestOpenSimulated(t *testing.T) {
	src := sourceFunc(func(bool) []GPU { return nil })
	o, err := Open(context.Background(), SourceConfig{Kind: SourceSimulated, CPUMilli: 16000,
		Simulated: func() (Source, inventory.Server, error) { return src, inventory.Server{Name: "sim"}, nil }})
	if err != nil || o.Source == nil || o.Inventory.Name != "sim" || o.Inventory.CPUMilli != 16000 {
		t.Fatalf("Open = %+v, %v; want the caller's source and sim with 16000m CPU", o, err)
	}
	o.Close()
	failed := errors.New("no device dir")
	if _, err := Open(context.Background(), SourceConfig{Kind: SourceSimulated,
		Simulated: func() (Source, inventory.Server, error) { return nil, inventory.Server{}, failed }}); !errors.Is(err, failed) {
		t.Errorf("a failing opener: %v", err)
	}
}

// TestOpenUnknownSource names the sources there are.
func TestOpenUnknownSource(t *testing.T) {
	if _, err := Open(context.Background(), SourceConfig{Kind: "nvidia-smi"}); err == nil ||
		err.Error() != `source "nvidia-smi" is not one of simulated, nvml, dcgm` {
		t.Errorf("err = %v", err)
	}
}

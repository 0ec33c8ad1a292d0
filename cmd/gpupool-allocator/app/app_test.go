package app

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/allocator/store"
	"github.com/gpupool/gpupool/internal/logtest"
)

// TestRunServesUntilStopped: on a bolt store the allocator says where it
// serves once the store opened, serves the API as the leader, and when
// its context ends it stops and closes the store.
func TestRunServesUntilStopped(t *testing.T) {
	o := NewOptions()
	o.Listen, o.DataDir = "127.0.0.1:0", t.TempDir()
	var log logtest.Log
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran, returned := make(chan error, 1), make(chan struct{})
	go func() { ran <- Run(ctx, o, log.Logger()); close(returned) }()

	address := logtest.Value(log.Await(t, "allocator serving", returned), "address")
	log.Await(t, "allocator ready", returned)
	for path, want := range map[string]string{"/v1/pool": `"servers"`, "/metrics": "bitfusion_allocator_leader 1\n", "/healthz": "ok\n"} {
		resp, err := http.Get(address + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %d %s, want 200 with %q", path, resp.StatusCode, body, want)
		}
	}

	cancel()
	if err := <-ran; err != nil {
		t.Errorf("Run stopped with %v, want nil", err)
	}
	b, err := store.OpenBolt(o.DataDir, 100*time.Millisecond)
	if err != nil {
		t.Fatalf("the store is still held once Run returned: %v", err)
	}
	_ = b.Close()
}

// TestDamagedStoreEndsRunUnserved: a store that does not open ends Run
// with why, never said to be served.
func TestDamagedStoreEndsRunUnserved(t *testing.T) {
	o := NewOptions()
	o.Listen, o.DataDir = "127.0.0.1:0", t.TempDir()
	if err := os.WriteFile(filepath.Join(o.DataDir, "gpupool.db"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var log logtest.Log
	err := Run(context.Background(), o, log.Logger())
	if err == nil || !strings.Contains(err.Error(), "opening the store") || !strings.Contains(err.Error(), "is damaged") {
		t.Errorf("Run on a damaged store: %v, want it to say the store is damaged", err)
	}
	if strings.Contains(log.String(), "allocator serving") {
		t.Errorf("a damaged store was said to be served:\n%s", log.String())
	}
}

// TestRunOnAListenerWithASeed: a Listener given is where Run serves, and
// the loopback rule holds its address, not Listen's (off loopback, which
// would want TLS); Seed breaks placement's ties, so that one request on
// the same idle servers lands on different ones under different seeds.
func TestRunOnAListenerWithASeed(t *testing.T) {
	placed := map[string]bool{}
	for seed := range uint64(4) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		o := NewOptions()
		o.Listener, o.Listen, o.DataDir, o.Seed = ln, "192.0.2.1:8470", t.TempDir(), seed
		placed[placeOnIdleServers(t, o)] = true
	}
	if len(placed) < 2 {
		t.Errorf("seeds 0 to 3 all placed on %v, want the seed to break the tie", placed)
	}
}

// placeOnIdleServers runs the allocator of o, registers eight alike
// servers, and returns the one a one-GPU lease goes to.
func placeOnIdleServers(t *testing.T, o *Options) string {
	t.Helper()
	var log logtest.Log
	ctx, cancel := context.WithCancel(t.Context())
	ran, returned := make(chan error, 1), make(chan struct{})
	go func() { ran <- Run(ctx, o, log.Logger()); close(returned) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run stopped with %v, want nil", err)
		}
	}()
	log.Await(t, "allocator ready", returned)
	c, err := client.New([]string{"http://" + o.Listener.Addr().String()}, "")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		name := fmt.Sprint("gpu-", i)
		if err := c.RegisterServer(ctx, api.Server{Name: name, GPUs: []api.GPU{{UUID: "GPU-" + name, Model: "A100", MemoryBytes: 40 << 30, Healthy: true}}}); err != nil {
			t.Fatal(err)
		}
	}
	l, err := c.Acquire(ctx, api.AcquireRequest{Namespace: "ml", GPUAmount: 1, GPUPercent: 100, Owner: api.Owner{Pod: "p", UID: "uid-p"}})
	if err != nil {
		t.Fatal(err)
	}
	return l.Server
}

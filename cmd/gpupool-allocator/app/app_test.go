package app

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/store"
	"github.com/gpupool/gpupool/inventory"
)

// TestDamagedStoreIsRefused: the allocator never panics on, nor starts
// empty in place of, a store file it cannot read; it exits saying what to
// do, and `--check` tells a sound store from a damaged one.
func TestDamagedStoreIsRefused(t *testing.T) {
	good := t.TempDir()
	b, err := store.OpenBolt(good, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// Enough servers and leases that the file's used pages fill it: a cut
	// or an overwrite then always hits state, not slack.
	ctx := context.Background()
	for i := range 300 {
		name := fmt.Sprintf("gpu-%03d", i)
		c := store.Change{Servers: []inventory.Server{{Name: name, GPUs: []inventory.GPU{{UUID: "GPU-" + name, Model: "A100", MemoryBytes: 80 << 30, Healthy: true}}}},
			Leases: []allocator.Lease{{ID: fmt.Sprintf("lease-%06d", i+1), Namespace: "ml", Server: name, TTL: time.Hour, ExpiresAt: time.Now().Add(time.Hour),
				GPUs: []allocator.LeaseGPU{{UUID: "GPU-" + name, Model: "A100", Share: 500, MemoryBytes: 40 << 30}}}},
			NextID: uint64(i + 1)}
		if err := b.Apply(ctx, []store.Change{c}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(good, "gpupool.db"))
	if err != nil {
		t.Fatal(err)
	}

	out, code := runAllocator(t, "--check", "--data-dir", good)
	if code != 0 || !strings.Contains(out, "300 servers, 300 leases") || !strings.Contains(out, "ok") {
		t.Errorf("--check on a sound store: exit %d\n%s", code, out)
	}
	for name, damaged := range map[string][]byte{
		"cut in half":   data[:len(data)/2],
		"header zeroed": append(make([]byte, 8192), data[8192:]...),
		"random pages":  append(append([]byte(nil), data[:4*4096]...), bytes.Repeat([]byte{0x5a, 0xc3, 0x17}, (len(data)-4*4096)/3)...),
		"empty":         {},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "gpupool.db"), damaged, 0o600); err != nil {
			t.Fatal(err)
		}
		out, code := runAllocator(t, "--data-dir", dir, "--listen", "127.0.0.1:0")
		if code != 1 || !strings.Contains(out, "is damaged") || !strings.Contains(out, "restore it from a backup") ||
			strings.Contains(out, "goroutine ") || strings.Contains(out, "allocator ready") || strings.Contains(out, "allocator serving") ||
			strings.Contains(out, "panic") || strings.Contains(out, "assertion failed") {
			t.Errorf("%s: exit %d, want 1 with a message saying what to do\n%s", name, code, out)
		}
		if fi, err := os.Stat(filepath.Join(dir, "gpupool.db")); err != nil || fi.Size() != int64(len(damaged)) {
			t.Errorf("%s: the damaged file was changed (%v)", name, err)
		}
		if out, code := runAllocator(t, "--check", "--data-dir", dir); code != 1 || !strings.Contains(out, "is damaged") {
			t.Errorf("%s: --check exit %d, want 1 naming the damage\n%s", name, code, out)
		}
	}
}

// runAllocator runs the allocator binary to its end and returns its
// output and exit code.
func runAllocator(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "gpupool-allocator"), args...).CombinedOutput()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	case err != nil:
		t.Fatalf("gpupool-allocator %v: %v\n%s", args, err, out)
	}
	return string(out), 0
}

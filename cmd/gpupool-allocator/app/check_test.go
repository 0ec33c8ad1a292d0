package app

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/store"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/inventory"
)

// boltStore writes a bolt store in a new directory: one server of one A100
// and a lease of share thousandths of it for each of shares.
func boltStore(t *testing.T, shares ...allocator.Share) string {
	t.Helper()
	dir := t.TempDir()
	b, err := store.OpenBolt(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := store.Change{Servers: []inventory.Server{{Name: "gpu-1", GPUs: []inventory.GPU{{UUID: "GPU-1", Model: "A100", MemoryBytes: 80 << 30, Healthy: true}}}}}
	for i, share := range shares {
		c.Leases = append(c.Leases, allocator.Lease{ID: fmt.Sprintf("lease-%06d", i+1), Namespace: "ml", Server: "gpu-1", TTL: time.Hour, ExpiresAt: time.Now().Add(time.Hour),
			GPUs: []allocator.LeaseGPU{{UUID: "GPU-1", Model: "A100", Share: share}}})
		c.NextID = uint64(i + 1)
	}
	if err := b.Apply(context.Background(), []store.Change{c}); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestCheck: --check says what a store holds on stdout, and its faults on
// stderr, and exits 0 only for a sound one; without --check the allocator
// serves.
func TestCheck(t *testing.T) {
	sound, inconsistent, damaged := boltStore(t, 500), boltStore(t, 600, 600), t.TempDir()
	if err := os.WriteFile(filepath.Join(damaged, "gpupool.db"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name           string
		o              Options
		exit           int
		stdout, stderr string // stdout whole, stderr a part
	}{
		{name: "sound", o: Options{Check: true, Store: "bolt", DataDir: sound},
			stdout: "store " + sound + ": 1 servers, 1 leases (0 expired: a start would end them), next lease ID 2\nok\n"},
		{name: "inconsistent", o: Options{Check: true, Store: "bolt", DataDir: inconsistent}, exit: 1,
			stdout: "store " + inconsistent + ": 1 servers, 2 leases (0 expired: a start would end them), next lease ID 3\ninconsistent: 1 leases would be dropped on start\n",
			stderr: "gpupool-allocator: store " + inconsistent + ": lease lease-000002 does not fit its server: "},
		{name: "damaged", o: Options{Check: true, Store: "bolt", DataDir: damaged}, exit: 1,
			stderr: "gpupool-allocator: store " + damaged + ": store file " + filepath.Join(damaged, "gpupool.db") + " is damaged"},
		{name: "unknown store", o: Options{Check: true, Store: "sqlite"}, exit: cli.ExitUsage,
			stderr: "gpupool-allocator: --store \"sqlite\" is not one of bolt, etcd\n"},
	} {
		var stdout, stderr bytes.Buffer
		exit, done := Check(&tc.o, &stdout, &stderr)
		if !done || exit != tc.exit || stdout.String() != tc.stdout || !strings.Contains(stderr.String(), tc.stderr) || (tc.stderr == "") != (stderr.Len() == 0) {
			t.Errorf("%s: done %v, exit %d, stdout %q, stderr %q; want exit %d, stdout %q, stderr with %q",
				tc.name, done, exit, stdout.String(), stderr.String(), tc.exit, tc.stdout, tc.stderr)
		}
	}
	if _, done := Check(&Options{Store: "bolt", DataDir: sound}, &bytes.Buffer{}, &bytes.Buffer{}); done {
		t.Error("without --check, Check is done: the allocator would not serve")
	}
}

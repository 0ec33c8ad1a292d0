package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/inventory"
)

// writeStore fills a store in dir with servers and leases, as an allocator
// that ran a while leaves it, and returns what it holds.
func writeStore(t *testing.T, dir string) State {
	t.Helper()
	b, err := OpenBolt(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 300 {
		name := fmt.Sprintf("gpu-%03d", i)
		c := Change{Servers: []inventory.Server{{Name: name, GPUs: []inventory.GPU{{UUID: "GPU-" + name, Model: "A100", MemoryBytes: 80 << 30, Healthy: true}}}},
			Leases: []allocator.Lease{{ID: fmt.Sprintf("lease-%06d", i), Namespace: "ml", Server: name,
				GPUs: []allocator.LeaseGPU{{UUID: "GPU-" + name, Model: "A100", Share: 500}}}},
			NextID: uint64(i + 1)}
		if i%3 == 0 && i > 0 {
			c.Ended = []string{fmt.Sprintf("lease-%06d", i-1)} // freed pages, as real use leaves
		}
		if err := b.Apply(ctx, []Change{c}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := b.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestDamagedFilesAreRefused damages a store in the ways a disk or an
// operator does (cut short, pages overwritten, header zeroed, emptied):
// opening it must fail with a DamagedError that says what to do, never
// panic or start empty, and --check's CheckBolt must agree. Damage that
// only hit free pages may open, and must then read back unchanged.
func TestDamagedFilesAreRefused(t *testing.T) {
	src := t.TempDir()
	want := writeStore(t, src)
	data, err := os.ReadFile(filepath.Join(src, boltFile))
	if err != nil {
		t.Fatal(err)
	}
	const page = 4096
	damages := map[string][]byte{
		"empty":       {},
		"cut in half": data[:len(data)/2],
		"header zeroed": func() []byte {
			d := append([]byte(nil), data...)
			clear(d[:2*page])
			return d
		}(),
		"random pages": func() []byte {
			d := append([]byte(nil), data...)
			rng := rand.New(rand.NewPCG(1, 2))
			for i := 4 * page; i < len(d); i++ {
				d[i] = byte(rng.Uint32())
			}
			return d
		}(),
	}
	mustRefuse := map[string]bool{"empty": true, "cut in half": true, "header zeroed": true, "random pages": true}
	for cut := page; cut < len(data); cut += page + 512 {
		damages[fmt.Sprintf("cut at %d", cut)] = data[:cut]
	}
	for pages := 1; pages <= 8; pages++ {
		damages[fmt.Sprintf("last %d pages cut", pages)] = data[:len(data)-pages*page]
	}
	// Cut where the freelist page starts: reading it read-only once
	// faulted on a goroutine of bbolt's own, past any recover.
	damages["cut at the freelist"] = data[:freelistPage(data)*page]
	for seed := range uint64(40) {
		d := append([]byte(nil), data...)
		rng := rand.New(rand.NewPCG(seed, 7))
		at := rng.IntN(len(d) / page)
		for i := at * page; i < (at+1)*page; i++ {
			d[i] = byte(rng.Uint32())
		}
		damages[fmt.Sprintf("page %d overwritten", at)] = d
	}
	for name, d := range damages {
		t.Run(name, func(t *testing.T) {
			// Two copies: a refused file stays locked until the process
			// exits, as the allocator and --check do.
			dir, checkDir := t.TempDir(), t.TempDir()
			for _, d2 := range []string{dir, checkDir} {
				if err := os.WriteFile(filepath.Join(d2, boltFile), d, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			_, checkErr := CheckBolt(checkDir, time.Second)
			b, err := OpenBolt(dir, time.Second)
			var damaged *DamagedError
			if err != nil {
				if !errors.As(err, &damaged) || !strings.Contains(err.Error(), "restore it from a backup") || !strings.Contains(err.Error(), "--check") {
					t.Fatalf("open: %v; want a DamagedError saying what to do", err)
				}
				for _, internal := range []string{"panic", "assertion failed"} {
					for _, e := range []error{err, checkErr} {
						if e != nil && strings.Contains(e.Error(), internal) {
							t.Errorf("refusal %q: bbolt's %q is no message for an operator", e, internal)
						}
					}
				}
				if checkErr == nil {
					t.Errorf("OpenBolt refused the file (%v) but CheckBolt passed it", err)
				}
				return
			}
			defer func() { _ = b.Close() }()
			if mustRefuse[name] {
				t.Fatalf("opened a store that is %s", name)
			}
			got, err := b.Load(context.Background())
			if err != nil || !reflect.DeepEqual(got, want) || checkErr != nil {
				t.Fatalf("opened a damaged store that reads back differently (load: %v, check: %v)", err, checkErr)
			}
		})
	}
}

// TestHeldStoreIsNotDamaged: a store another allocator holds is a timeout
// that says so, not damage.
func TestHeldStoreIsNotDamaged(t *testing.T) {
	dir := t.TempDir()
	b, err := OpenBolt(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Close() }()
	_, err = OpenBolt(dir, 50*time.Millisecond)
	var damaged *DamagedError
	if err == nil || errors.As(err, &damaged) || !strings.Contains(err.Error(), "another allocator") {
		t.Fatalf("second open: %v; want a timeout naming another allocator", err)
	}
}

// freelistPage reads the freelist's page ID from the newer of a bbolt
// file's two meta pages (page header 16 bytes, then magic, version, page
// size, flags, the root bucket's 16 bytes, the freelist's page ID at 48,
// the high water mark and the transaction ID at 64).
func freelistPage(data []byte) int {
	meta := func(p int) (txid, freelist uint64) {
		b := data[p*4096:]
		return binary.LittleEndian.Uint64(b[64:]), binary.LittleEndian.Uint64(b[48:])
	}
	tx0, f0 := meta(0)
	tx1, f1 := meta(1)
	if tx1 > tx0 {
		return int(f1)
	}
	return int(f0)
}

// TestLinksAndTopologyComeBack: a server's GPU links and the topology a
// lease asked for survive a restart, so that the restored pool places by
// the same links and a retry of the request is recognised.
func TestLinksAndTopologyComeBack(t *testing.T) {
	srv := inventory.Server{Name: "gpu-1", GPUs: []inventory.GPU{
		{Index: 0, UUID: "GPU-a", Model: "A100", Healthy: true},
		{Index: 1, UUID: "GPU-b", Model: "A100", Healthy: true},
	}}
	srv.SetTopology(inventory.PCIeTopology(2, 2, 1))
	lease := allocator.Lease{ID: "lease-000001", Namespace: "ml", Server: "gpu-1",
		GPUs:    []allocator.LeaseGPU{{Index: 0, UUID: "GPU-a", Model: "A100", Share: allocator.WholeGPU}, {Index: 1, UUID: "GPU-b", Model: "A100", Share: allocator.WholeGPU}},
		Request: allocator.Request{Namespace: "ml", GPUs: 2, Topology: inventory.LinkPCIeSwitch}}
	b, err := OpenBolt(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Close() }()
	if err := b.Apply(context.Background(), []Change{{Servers: []inventory.Server{srv}, Leases: []allocator.Lease{lease}}}); err != nil {
		t.Fatal(err)
	}
	st, err := b.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Servers[0].GPUs[1].Links; !reflect.DeepEqual(got, srv.GPUs[1].Links) {
		t.Errorf("gpu1's links came back as %v, want %v", got, srv.GPUs[1].Links)
	}
	if got := st.Leases[0].Request.Topology; got != inventory.LinkPCIeSwitch {
		t.Errorf("the lease's topology came back as %s, want pcie-switch", got)
	}
}

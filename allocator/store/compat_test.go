package store_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/store"
)

// TestReadsWhatThePreviousVersionWrote opens a store holding the records
// an allocator wrote before the store had record types of its own
// (testdata/state-before-wire-types.txt): every lease comes back on its
// GPUs with its request, so that a retry still finds it, and writing the
// state again gives the same bytes.
func TestReadsWhatThePreviousVersionWrote(t *testing.T) {
	dir := t.TempDir()
	old := writeOldStore(t, dir)
	b, err := store.OpenBolt(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	st, err := b.Load(context.Background())
	_ = b.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Servers) != 2 || len(st.Leases) != 3 || st.NextID != 5 {
		t.Fatalf("loaded %d servers, %d leases, next ID %d; want 2, 3 and 5", len(st.Servers), len(st.Leases), st.NextID)
	}

	pol, err := allocator.NewPolicy("best-fit", allocator.PolicyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := allocator.NewPool(allocator.PoolConfig{Policy: pol, DefaultTTL: time.Minute, MaxTTL: 100_000 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st.Servers {
		if err := pool.RestoreServer(s); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range st.Leases {
		if err := pool.Restore(l); err != nil {
			t.Errorf("lease %s was lost: %v", l.ID, err)
		}
	}
	pool.SetNextID(st.NextID)
	if err := pool.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 24, 7, 0, 0, 0, time.UTC)
	want := map[string]allocator.Share{"lease-000001": allocator.SharePercent(50), "lease-000002": 140, "lease-000004": allocator.WholeGPU}
	for _, l := range pool.Leases(now) {
		if l.GPUs[0].Share != want[l.ID] {
			t.Errorf("lease %s holds %s, want %s", l.ID, l.GPUs[0].Share, want[l.ID])
		}
		delete(want, l.ID)
	}
	if len(want) > 0 {
		t.Errorf("leases %v are not live after the restore", want)
	}
	retry := allocator.Request{Namespace: "ml", GPUs: 1, Percent: 50, CPUMilli: 500, MemoryBytes: 4 << 30, Models: []string{"A100"},
		Owner: allocator.Owner{Pod: "train-0", UID: "u0", Labels: map[string]string{"app": "tf-training"}}, IdempotencyKey: "k0", TTL: 87000 * time.Hour}
	if l, err := pool.Acquire(now, retry); err != nil || l.ID != "lease-000001" {
		t.Errorf("a retry of the first lease's request got %s (%v), want lease-000001 back", l.ID, err)
	}
	if l, err := pool.Acquire(now, allocator.Request{Namespace: "ml", GPUs: 1}); err != nil || l.ID != "lease-000006" {
		t.Errorf("a new lease got ID %s (%v), want lease-000006 after the stored counter", l.ID, err)
	}

	again := t.TempDir()
	b, err = store.OpenBolt(again, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	err = b.Apply(context.Background(), []store.Change{{Servers: st.Servers, Leases: st.Leases, NextID: st.NextID}})
	_ = b.Close()
	if err != nil {
		t.Fatal(err)
	}
	if rewritten := readRecords(t, again); rewritten != old {
		t.Errorf("the state written again differs from what the previous version wrote:\n%s\nwant\n%s", rewritten, old)
	}
}

// writeOldStore writes the fixture's records into a bolt file in dir, as
// the previous version left them, and returns them as the fixture lists
// them.
func writeOldStore(t *testing.T, dir string) string {
	t.Helper()
	f, err := os.Open("testdata/state-before-wire-types.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	db, err := bolt.Open(filepath.Join(dir, "gpupool.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	var records []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		records = append(records, line)
		bucket, rest, _ := strings.Cut(line, " ")
		key, value, _ := strings.Cut(rest, " ")
		data := []byte(value)
		if bucket == "meta" {
			n, err := strconv.ParseUint(value, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			data = binary.BigEndian.AppendUint64(nil, n)
		}
		err := db.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte(bucket))
			if err != nil {
				return err
			}
			return b.Put([]byte(key), data)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(records, "\n")
}

// readRecords lists a bolt store's records as the fixture does.
func readRecords(t *testing.T, dir string) string {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "gpupool.db"), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	var records []string
	err = db.View(func(tx *bolt.Tx) error {
		for _, bucket := range []string{"servers", "leases", "meta"} {
			err := tx.Bucket([]byte(bucket)).ForEach(func(k, v []byte) error {
				value := string(v)
				if bucket == "meta" {
					value = strconv.FormatUint(binary.BigEndian.Uint64(v), 10)
				}
				records = append(records, bucket+" "+string(k)+" "+value)
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(records, "\n")
}

package store

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/gpupool/gpupool/allocator"
)

var (
	serversBucket = []byte("servers")
	leasesBucket  = []byte("leases")
	metaBucket    = []byte("meta")
	nextIDKey     = []byte("next-id")
)

// Bolt is the embedded default store: one bbolt file in a data directory,
// synced to disk on every commit.
type Bolt struct {
	db *bolt.DB
}

// OpenBolt opens (creating if needed) the store in dir. Only one process
// may hold it; a second waits up to timeout, then fails.
func OpenBolt(dir string, timeout time.Duration) (*Bolt, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, "gpupool.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: timeout})
	if err != nil {
		return nil, fmt.Errorf("opening %s (is another allocator using it?): %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{serversBucket, leasesBucket, metaBucket} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("initializing %s: %w", path, err)
	}
	return &Bolt{db: db}, nil
}

// Name implements Store.
func (*Bolt) Name() string { return "bolt" }

// Load implements Store.
func (b *Bolt) Load(context.Context) (State, error) {
	var st State
	err := b.db.View(func(tx *bolt.Tx) error {
		err := tx.Bucket(serversBucket).ForEach(func(k, v []byte) error {
			var s allocator.Server
			if err := json.Unmarshal(v, &s); err != nil {
				return fmt.Errorf("server %s: %w", k, err)
			}
			st.Servers = append(st.Servers, s)
			return nil
		})
		if err != nil {
			return err
		}
		err = tx.Bucket(leasesBucket).ForEach(func(k, v []byte) error {
			var l allocator.Lease
			if err := json.Unmarshal(v, &l); err != nil {
				return fmt.Errorf("lease %s: %w", k, err)
			}
			st.Leases = append(st.Leases, l)
			return nil
		})
		if err != nil {
			return err
		}
		if v := tx.Bucket(metaBucket).Get(nextIDKey); len(v) == 8 {
			st.NextID = binary.BigEndian.Uint64(v)
		}
		return nil
	})
	return st, err
}

// Apply implements Store: all changes in one transaction, one fsync.
func (b *Bolt) Apply(_ context.Context, changes []Change) error {
	return b.db.Update(func(tx *bolt.Tx) error {
		servers, leases, meta := tx.Bucket(serversBucket), tx.Bucket(leasesBucket), tx.Bucket(metaBucket)
		for _, c := range changes {
			for _, s := range c.Servers {
				if err := putJSON(servers, s.Name, s); err != nil {
					return err
				}
			}
			for _, l := range c.Leases {
				if err := putJSON(leases, l.ID, l); err != nil {
					return err
				}
			}
			for _, id := range c.Ended {
				if err := leases.Delete([]byte(id)); err != nil {
					return err
				}
			}
			if c.NextID > 0 {
				if err := meta.Put(nextIDKey, binary.BigEndian.AppendUint64(nil, c.NextID)); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

func putJSON(b *bolt.Bucket, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put([]byte(key), data)
}

// Close implements Store.
func (b *Bolt) Close() error { return b.db.Close() }

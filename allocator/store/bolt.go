package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

var (
	serversBucket = []byte("servers")
	leasesBucket  = []byte("leases")
	metaBucket    = []byte("meta")
	quotasBucket  = []byte("quotas")
	nextIDKey     = []byte("next-id")
)

// Bolt is the embedded default store: one bbolt file in a data directory,
// synced to disk on every commit.
type Bolt struct {
	db *bolt.DB
}

// OpenBolt opens the store in dir, creating an empty one where there is
// no file yet. Only one process may hold it; a second waits up to timeout,
// then fails. A file that is there but damaged (cut short, overwritten,
// emptied) is a *DamagedError: the allocator never starts empty on its own
// in place of state it could not read.
func OpenBolt(dir string, timeout time.Duration) (*Bolt, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, boltFile)
	if fi, err := os.Stat(path); err == nil && fi.Size() == 0 {
		// bbolt would take an empty file for a new store.
		return nil, &DamagedError{Path: path, Err: errors.New("the file is empty")}
	}
	db, err := openChecked(path, &bolt.Options{Timeout: timeout})
	if err != nil {
		return nil, err
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{serversBucket, leasesBucket, metaBucket, quotasBucket} {
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

// CheckBolt verifies the store file in dir without changing it: its
// structure (every page reachable or free, exactly once) and that every
// record decodes. It returns what the file holds.
func CheckBolt(dir string, timeout time.Duration) (State, error) {
	path := filepath.Join(dir, boltFile)
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return State{}, fmt.Errorf("no store at %s: %w", path, err)
	case fi.Size() == 0:
		return State{}, &DamagedError{Path: path, Err: errors.New("the file is empty")}
	}
	// Read-only, bbolt reads the freelist lazily, inside Check's own
	// goroutine, where a fault could not be caught: read it at open.
	db, err := openChecked(path, &bolt.Options{Timeout: timeout, ReadOnly: true, PreLoadFreelist: true})
	if err != nil {
		return State{}, err
	}
	defer func() { _ = db.Close() }()
	st, err := (&Bolt{db: db}).Load(context.Background())
	if err != nil {
		return State{}, &DamagedError{Path: path, Err: err}
	}
	return st, nil
}

// boltFile is the store's file in the data directory.
const boltFile = "gpupool.db"

// openChecked opens a bbolt file and checks it before anything reads it
// for real: bbolt panics on pages it cannot parse, and a file cut short
// faults when a page past its end is read; both become a *DamagedError.
func openChecked(path string, opts *bolt.Options) (db *bolt.DB, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			// A panic inside bolt.Open leaves the file mapped, and so
			// locked, until the process exits, which it does on a
			// DamagedError.
			if db != nil {
				_ = db.Close()
			}
			db, err = nil, &DamagedError{Path: path, Err: fmt.Errorf("%v", r)}
		}
	}()
	db, err = bolt.Open(path, 0o600, opts)
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return nil, fmt.Errorf("opening %s: another process holds it (is another allocator using this data dir?)", path)
	case errors.As(err, new(*fs.PathError)):
		return nil, fmt.Errorf("opening %s: %w", path, err) // permissions, a full disk: not the file's content
	case err != nil:
		return nil, &DamagedError{Path: path, Err: err} // invalid meta pages, checksums, a size too small
	}
	err = db.View(func(tx *bolt.Tx) error {
		// Read every record here, where a fault is caught, before
		// Check walks the same pages on a goroutine of its own.
		if err := tx.ForEach(func(_ []byte, b *bolt.Bucket) error {
			return b.ForEach(func(_, _ []byte) error { return nil })
		}); err != nil {
			return err
		}
		var errs []error
		for e := range tx.Check() {
			errs = append(errs, e)
		}
		return errors.Join(errs...)
	})
	if err != nil {
		_ = db.Close()
		return nil, &DamagedError{Path: path, Err: err}
	}
	return db, nil
}

// DamagedError says a store file cannot be read as it was written, and
// what the operator can do about it.
type DamagedError struct {
	Path string
	Err  error
}

func (e *DamagedError) Error() string {
	return fmt.Sprintf("store file %s is damaged (%s): restore it from a backup, or move it aside "+
		"(mv %s %s.damaged) to start with an empty pool, where the GPU servers register again and the leases it held are lost; "+
		"`gpupool-allocator --check --data-dir %s` verifies a store", e.Path, bboltWords.Replace(e.Err.Error()), e.Path, e.Path, filepath.Dir(e.Path))
}

func (e *DamagedError) Unwrap() error { return e.Err }

// bboltWords drops what bbolt's own panics and checks say of themselves
// ("panic: assertion failed: Page expected to be: 0, ..."): the page's
// fault is the news, not bbolt's reaction to it.
var bboltWords = strings.NewReplacer("panic: ", "", "assertion failed: ", "")

// Name implements Store.
func (*Bolt) Name() string { return "bolt" }

// Load implements Store.
func (b *Bolt) Load(context.Context) (State, error) {
	var st State
	err := b.db.View(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{serversBucket, leasesBucket, metaBucket} {
			if tx.Bucket(name) == nil {
				return fmt.Errorf("no %s bucket: not a gpupool store", name)
			}
		}
		if err := readBucket(tx.Bucket(serversBucket), "server", decodeServer, &st.Servers); err != nil {
			return err
		}
		if err := readBucket(tx.Bucket(leasesBucket), "lease", decodeLease, &st.Leases); err != nil {
			return err
		}
		// A store written before quotas were stored has no bucket for
		// them until it is opened for writing.
		if b := tx.Bucket(quotasBucket); b != nil {
			if err := readBucket(b, "quota", decodeQuota, &st.Quotas); err != nil {
				return err
			}
		}
		if v := tx.Bucket(metaBucket).Get(nextIDKey); len(v) == 8 {
			st.NextID = binary.BigEndian.Uint64(v)
		}
		return nil
	})
	return st, err
}

// readBucket decodes every record of a bucket into out.
func readBucket[T any](b *bolt.Bucket, kind string, decode func([]byte) (T, error), out *[]T) error {
	return b.ForEach(func(k, v []byte) error {
		if err := appendDecoded(out, decode, v); err != nil {
			return fmt.Errorf("%s %s: %w", kind, k, err)
		}
		return nil
	})
}

// Apply implements Store: all changes in one transaction, one fsync.
func (b *Bolt) Apply(_ context.Context, changes []Change) error {
	return b.db.Update(func(tx *bolt.Tx) error {
		servers, leases, meta, quotas := tx.Bucket(serversBucket), tx.Bucket(leasesBucket), tx.Bucket(metaBucket), tx.Bucket(quotasBucket)
		putIn := func(b *bolt.Bucket) func(string, []byte) error {
			return func(key string, data []byte) error { return b.Put([]byte(key), data) }
		}
		for _, c := range changes {
			if err := putRecords(c.Servers, serverKey, encodeServer, putIn(servers)); err != nil {
				return err
			}
			if err := putRecords(c.Leases, leaseKey, encodeLease, putIn(leases)); err != nil {
				return err
			}
			for _, id := range c.Ended {
				if err := leases.Delete([]byte(id)); err != nil {
					return err
				}
			}
			if err := putRecords(c.Quotas, quotaKey, encodeQuota, putIn(quotas)); err != nil {
				return err
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

// Close implements Store.
func (b *Bolt) Close() error { return b.db.Close() }

// Package store keeps the allocator's state durable: the registered
// servers, the live leases, the lease ID counter and the namespace quotas
// set or removed through the API. Tokens, and the quotas the config file
// starts with, come from the config file and are not stored.
//
// The allocator applies a change to its in-memory pool first, then hands
// it to the store, and acknowledges the client only once Apply returned:
// an acknowledged lease survives a crash; an unacknowledged one may not,
// and its client retries with the same idempotency key.
package store

import (
	"context"
	"errors"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/inventory"
)

// State is what an allocator recovers on start.
type State struct {
	Servers []inventory.Server
	Leases  []allocator.Lease
	Quotas  []Quota
	NextID  uint64
}

// Quota is a namespace's quota as the API last left it: Limited false
// records a removed quota, so that one the config file sets does not come
// back on a restart.
type Quota struct {
	Namespace string
	Limited   bool
	Hard      allocator.Share
}

// Change is one step of the pool to make durable.
type Change struct {
	Servers []inventory.Server // registered or changed
	Leases  []allocator.Lease  // granted or renewed
	Ended   []string           // IDs of leases released or expired
	Quotas  []Quota            // set or removed
	NextID  uint64             // the lease ID counter after the step; 0 leaves it
}

// ErrUnavailable wraps an Apply error that may pass (the store's servers
// electing a leader, a connection lost): the changes may or may not have
// been made durable, and applying the same changes again is safe.
var ErrUnavailable = errors.New("store unavailable")

// Store is where the allocator's state lives between restarts.
type Store interface {
	// Load returns everything stored.
	Load(ctx context.Context) (State, error)
	// Apply makes changes durable, in order, before it returns; a batch of
	// changes costs one sync (group commit).
	Apply(ctx context.Context, changes []Change) error
	// Name says which store this is, for logs and metrics.
	Name() string
	Close() error
}

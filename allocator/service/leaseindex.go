package service

import (
	"cmp"
	"slices"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/store"
)

// leaseIndex mirrors the pool's leases by server, kept from the changes the
// service writes (granted, renewed, ended), so that what one server's
// daemon or node side asks every few seconds costs the leases on that
// server rather than a copy of the whole pool's: at 1,000 servers that
// copy, made by each of them, made the allocator's work grow with servers
// times leases. Its leases are replaced whole on every change, never
// changed in place, so handing them out shares nothing that changes.
type leaseIndex struct {
	onServer map[string]map[string]allocator.Lease
	serverOf map[string]string
}

func newLeaseIndex(leases []allocator.Lease) *leaseIndex {
	x := &leaseIndex{onServer: map[string]map[string]allocator.Lease{}, serverOf: map[string]string{}}
	for _, l := range leases {
		x.put(l)
	}
	return x
}

func (x *leaseIndex) put(l allocator.Lease) {
	on := x.onServer[l.Server]
	if on == nil {
		on = map[string]allocator.Lease{}
		x.onServer[l.Server] = on
	}
	on[l.ID] = l
	x.serverOf[l.ID] = l.Server
}

func (x *leaseIndex) end(id string) {
	server, ok := x.serverOf[id]
	if !ok {
		return
	}
	delete(x.serverOf, id)
	delete(x.onServer[server], id)
	if len(x.onServer[server]) == 0 {
		delete(x.onServer, server)
	}
}

// apply takes in a change the service made to the pool.
func (x *leaseIndex) apply(c store.Change) {
	for _, l := range c.Leases {
		x.put(l)
	}
	for _, id := range c.Ended {
		x.end(id)
	}
}

// on returns the server's leases live at now, in the pool's order (by ID).
// A lease whose time ran out is left out before the write that ends it,
// as the pool leaves it out of what it lists.
func (x *leaseIndex) on(server string, now time.Time) []allocator.Lease {
	var out []allocator.Lease
	for _, l := range x.onServer[server] {
		if l.UntilReleased() || now.Before(l.ExpiresAt) {
			out = append(out, l)
		}
	}
	// Lease IDs are numbers zero-padded to a least width: shorter first.
	slices.SortFunc(out, func(a, b allocator.Lease) int {
		return cmp.Or(cmp.Compare(len(a.ID), len(b.ID)), cmp.Compare(a.ID, b.ID))
	})
	return out
}

// Package allocator is the pure core of the GPU pool: the servers
// registered (each an inventory.Server), requests in the Bitfusion
// vocabulary, placement policies, namespace quotas and leases.
//
// Nothing here does I/O or reads a clock. Every operation on a Pool takes
// the current time as an argument, so the same inputs always produce the
// same state; the HTTP service, the store and the trace simulator wrap it.
//
// Every amount of GPU is a Share (milli-GPUs): percent requests, memory
// requests (rounded up to the next milli-GPU of the GPU they land on) and
// quotas count in one unit without rounding loss.
package allocator

// Package allocator is the pure core of the GPU pool: inventory, requests in
// the Bitfusion vocabulary, placement policies, namespace quotas and leases.
//
// Nothing here does I/O or reads a clock. Every operation on a Pool takes
// the current time as an argument, so the same inputs always produce the
// same state; the HTTP service, the store and the trace simulator wrap it.
//
// Shares are kept in milli-GPUs (1000 = one whole GPU) so that percent
// requests (10 milli per percent) and memory requests (rounded up to the
// next milli of the GPU they land on) share one unit without rounding loss.
package allocator

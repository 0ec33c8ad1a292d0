package adapter

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/gpupool/gpupool/allocator"
	allocapi "github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/gpuserver/api"
)

// newLeaseGrace is how long a lease may go unreported by its server's
// daemon (which learns of new leases on its next heartbeat) before the
// missing reading makes the answer "no data" rather than leaving the new
// lease out, as the HPA leaves out pods that are not ready yet.
const newLeaseGrace = 30 * time.Second

// Direct is the embedded backend: it reads the pool and the leases from
// the allocator and each GPU server's latest round from its daemon
// (GET /v1/usage), at most once per refresh whatever the request rate.
type Direct struct {
	allocator *client.Client
	http      *http.Client
	refresh   time.Duration
	clock     func() time.Time
	log       *slog.Logger

	mu   sync.Mutex
	view *poolView
	// reading is closed when the read in flight ends (nil when none is);
	// readErr is the last read's failure.
	reading chan struct{}
	readErr error
}

// poolView is one read of the pool.
type poolView struct {
	at     time.Time
	pool   allocapi.PoolStatus
	leases []allocator.Lease
	// usage is each server's latest round; a server whose daemon did not
	// answer is missing. readings indexes their lease readings.
	usage    map[string]*api.Usage
	readings map[api.LeaseGPU]*api.LeaseUsage
	// idle are the allocator's verdicts on the leases it measured idle, by
	// lease ID.
	idle map[string]*allocapi.LeaseIdle
}

// readTimeout bounds one read of the pool, daemons included.
const readTimeout = 5 * time.Second

// NewDirect reads through c (whose token must see every namespace) and
// refreshes its view of the pool at most every refresh.
func NewDirect(c *client.Client, refresh time.Duration, log *slog.Logger) *Direct {
	return &Direct{allocator: c, http: &http.Client{Timeout: 2 * time.Second}, refresh: refresh, clock: time.Now, log: log}
}

// Name implements Backend.
func (*Direct) Name() string { return "direct" }

// Query implements Backend.
func (d *Direct) Query(ctx context.Context, q Query) ([]Value, error) {
	v, err := d.current(ctx)
	if err != nil {
		return nil, err
	}
	switch q.Metric {
	case GPUUtilization, MemoryPressure:
		return v.leaseRatio(q, d.clock()), nil
	case RDMALatency:
		return v.latency(q), nil
	case PoolUnallocatedGPUs:
		return v.freeGPUs(q), nil
	case PendingRequests:
		return v.pending(q), nil
	case IdleHeldShare:
		return v.idleShare(q), nil
	}
	return nil, ErrUnknownMetric
}

// current returns a view of the pool no older than refresh, reading a new
// one when needed. While a read is in flight, queries are answered from the
// previous view if it is younger than 4 refreshes, so that no query waits
// on the allocator and the daemons in the steady state; the values keep
// their own dates, which the freshness guard checks.
func (d *Direct) current(ctx context.Context) (*poolView, error) {
	d.mu.Lock()
	now, v := d.clock(), d.view
	if v != nil && now.Sub(v.at) < d.refresh {
		d.mu.Unlock()
		return v, nil
	}
	done := d.reading
	if done == nil {
		done = make(chan struct{})
		d.reading = done
		go d.read(done) //nolint:gosec // the read serves every waiting query, not this one: one caller leaving must not cancel it
	}
	d.mu.Unlock()
	if v != nil && now.Sub(v.at) < 4*d.refresh {
		return v, nil
	}
	select {
	case <-done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.readErr != nil {
		return nil, d.readErr
	}
	return d.view, nil
}

// read reads the pool once and publishes the view, or the error.
func (d *Direct) read(done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	v, err := d.readPool(ctx)
	d.mu.Lock()
	if err == nil {
		d.view = v
	}
	d.readErr, d.reading = err, nil
	d.mu.Unlock()
	close(done)
}

func (d *Direct) readPool(ctx context.Context) (*poolView, error) {
	at := d.clock()
	pool, err := d.allocator.Pool(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the pool from the allocator: %w", err)
	}
	v := &poolView{at: at, pool: pool, usage: map[string]*api.Usage{}, idle: map[string]*allocapi.LeaseIdle{}}
	// The daemons' readings before the leases: a lease released between
	// the two reads is then missing from both, or read and not listed, and
	// never listed without its reading, which would make its workload's
	// answer no data. One granted between them is new, and left out.
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, s := range pool.Servers {
		url := s.Labels[api.LabelDaemonURL]
		if url == "" {
			continue
		}
		wg.Go(func() {
			u, err := api.FetchUsage(ctx, d.http, url)
			if err != nil {
				d.log.Warn("no reading from a GPU server", "server", s.Name, "url", url, "err", err)
				return
			}
			mu.Lock()
			v.usage[s.Name] = u
			mu.Unlock()
		})
	}
	wg.Wait()
	leases, err := d.allocator.Leases(ctx, client.LeaseFilter{})
	if err != nil {
		return nil, fmt.Errorf("listing leases from the allocator: %w", err)
	}
	v.leases = allocapi.CoreLeases(leases)
	for _, l := range leases {
		if l.Idle != nil {
			v.idle[l.ID] = l.Idle
		}
	}
	v.readings = map[api.LeaseGPU]*api.LeaseUsage{}
	for _, u := range v.usage {
		if u.SampledAt.IsZero() {
			continue // a daemon that has not sampled yet has no readings
		}
		for i := range u.Leases {
			r := &u.Leases[i]
			v.readings[r.Key()] = r
		}
	}
	return v, nil
}

// selected returns the namespace's leases whose owners match.
func (v *poolView) selected(q Query) []allocator.Lease {
	var out []allocator.Lease
	for _, l := range v.leases {
		if l.Namespace == q.Namespace && q.Selector.Matches(labels.Set(l.Owner.Labels)) {
			out = append(out, l)
		}
	}
	return out
}

// leaseRatio is GPUUtilization (SM use over share) or MemoryPressure
// (memory used over granted) summed over the selected leases' GPUs. A lease
// its daemon does not report yet, or reports unmeasured, is left out while
// new; one whose reading is gone (daemon down) or unknown makes the answer
// no data.
func (v *poolView) leaseRatio(q Query, now time.Time) []Value {
	var num, den float64
	var oldest dating
	for _, l := range v.selected(q) {
		u := v.usage[l.Server]
		if u == nil {
			return nil
		}
		for _, lg := range l.GPUs {
			r := v.readings[api.LeaseGPU{Lease: l.ID, GPU: lg.Index}]
			// A daemon follows a new lease a heartbeat before a round
			// has measured its processes: unknown until then, as when
			// unreported.
			if r == nil || q.Metric == GPUUtilization && r.SMUtilization == nil {
				if now.Sub(l.GrantedAt) < newLeaseGrace {
					continue
				}
				return nil
			}
			if q.Metric == GPUUtilization {
				num += *r.SMUtilization
				den += allocator.Share(r.Milli).GPUs()
			} else {
				num += float64(r.MemoryUsedBytes)
				den += float64(r.MemoryGrantedBytes)
			}
			oldest.add(u.SampledAt)
		}
	}
	if den == 0 {
		return nil // no selected lease has a reading: no data, not 0
	}
	return []Value{{Value: num / den, Time: oldest.t}}
}

// latency is the LatencyQuantile of the round trips the servers holding
// the selected leases measured in their window, per transport.
func (v *poolView) latency(q Query) []Value {
	sums := map[string]*api.LatencyWindow{}
	var oldest dating
	seen := map[string]bool{}
	for _, l := range v.selected(q) {
		if seen[l.Server] {
			continue
		}
		seen[l.Server] = true
		u := v.usage[l.Server]
		if u == nil {
			return nil
		}
		oldest.add(u.SampledAt)
		for _, w := range u.Latency {
			s := sums[w.Transport]
			if s == nil {
				s = &api.LatencyWindow{Transport: w.Transport, Buckets: append([]api.Bucket(nil), w.Buckets...)}
				s.Count = w.Count
				sums[w.Transport] = s
				continue
			}
			if len(s.Buckets) != len(w.Buckets) {
				continue // another bucket layout: not summable
			}
			for i := range s.Buckets {
				s.Buckets[i].Count += w.Buckets[i].Count
			}
			s.Count += w.Count
		}
	}
	var out []Value
	for transport, s := range sums {
		if s.Count == 0 {
			continue
		}
		out = append(out, Value{Labels: map[string]string{"transport": transport},
			Value: bucketQuantile(LatencyQuantile, s.Buckets, s.Count), Time: oldest.t})
	}
	return out
}

// dating is the oldest of the times added; a zero time (a daemon that has
// not sampled) stays the oldest, so the freshness guard refuses the value.
type dating struct {
	t   time.Time
	set bool
}

func (d *dating) add(t time.Time) {
	if !d.set || t.Before(d.t) {
		d.t, d.set = t, true
	}
}

// freeGPUs is the unleased share of healthy GPUs on schedulable servers,
// per model the selector matches.
func (v *poolView) freeGPUs(q Query) []Value {
	free := map[string]float64{}
	for _, s := range v.pool.Servers {
		for _, g := range s.GPUs {
			if !q.Selector.Matches(labels.Set{"model": g.Model}) {
				continue
			}
			free[g.Model] += 0
			if s.Schedulable && g.Healthy {
				free[g.Model] += (allocator.WholeGPU - g.Allocated()).GPUs()
			}
		}
	}
	var out []Value
	for model, f := range free {
		out = append(out, Value{Labels: map[string]string{"model": model}, Value: f, Time: v.at})
	}
	return out
}

// pending counts the namespace's queued requests whose owners match.
func (v *poolView) pending(q Query) []Value {
	n := 0
	for _, p := range v.pool.Pending {
		if p.Namespace == q.Namespace && q.Selector.Matches(labels.Set(p.Owner.Labels)) {
			n++
		}
	}
	return []Value{{Value: float64(n), Time: v.at}}
}

// idleShare is IdleHeldShare: the GPU share held by the selected leases
// that the allocator measured idle for their namespace's whole window,
// over the share all of them hold. It rests on the allocator alone, and
// is dated by the read. A lease measured idle for part of the window, or
// not measured at all, counts as in use: unknown is never idle.
func (v *poolView) idleShare(q Query) []Value {
	var idle, held allocator.Share // whole milli-GPUs: all idle is exactly 1
	for _, l := range v.selected(q) {
		share := l.Share()
		held += share
		if verdict := v.idle[l.ID]; verdict != nil && verdict.Whole {
			idle += share
		}
	}
	if held == 0 {
		return nil // no selected lease holds a GPU: no data, not 0
	}
	return []Value{{Value: idle.GPUs() / held.GPUs(), Time: v.at}}
}

// Package service runs the allocator core as a service: it serializes
// operations on the pool, makes every change durable through a store before
// it is acknowledged, expires leases and marks servers whose heartbeat
// stopped, queues requests that asked to wait, and serves it all over HTTP.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/store"
)

// Config configures a Service.
type Config struct {
	Store  store.Store
	Policy string
	Seed   uint64
	// DefaultTTL and MaxTTL bound lease lifetimes.
	DefaultTTL, MaxTTL time.Duration
	// HeartbeatTimeout is how long a server may stay silent before its
	// GPUs take no new leases.
	HeartbeatTimeout time.Duration
	// Quotas are GPU quotas by namespace, the config file's: the quotas
	// the API set or removed, kept in the store, apply over them.
	Quotas map[string]allocator.Share
	// StoreRetry is how long a batch the store could not write for a
	// reason that may pass (store.ErrUnavailable) is retried before the
	// store counts as failed; the requests it carries wait meanwhile.
	// Zero: 10s.
	StoreRetry time.Duration
	// MaxWaiting bounds the acquisitions queued for capacity or quota at
	// once, MaxWaitingPerNamespace those of one namespace: each holds a
	// connection and is retried whenever share frees up, so that one
	// tenant's queue would otherwise cost every other tenant's requests.
	// Past either bound an acquisition is refused (429), not queued.
	// Zero: 1000 and 100.
	MaxWaiting, MaxWaitingPerNamespace int
	// Clock returns the current time; time.Now when nil.
	Clock    func() time.Time
	Registry prometheus.Registerer
	Logger   *slog.Logger
}

// Service is the allocator behind the HTTP API.
type Service struct {
	cfg   Config
	log   *slog.Logger
	clock func() time.Time

	mu       sync.Mutex
	pool     *allocator.Pool
	lastSeen map[string]time.Time
	// waiting holds the requests queued for capacity or quota; waitingIn
	// counts them by namespace.
	waiting   map[*allocator.Request]*waiter
	waitingIn map[string]int
	recent    []allocator.Demand // ring of recent demands, the expected workload
	next      int

	// queued holds the changes the committer has yet to write, in the
	// order they were made; kick wakes the committer. The queue is
	// unbounded so that making a change never blocks under mu.
	qmu    sync.Mutex
	queued []commit
	kick   chan struct{}
	// broken is set once the store failed, a change panicked or the
	// service closed; failed is closed on a failure. After that nothing
	// more is written: the pool may be ahead of the store, or half
	// changed, and only a new Service, loaded from the store, recovers.
	broken   atomic.Bool
	failOnce sync.Once
	failed   chan struct{}
	// closing ends the committer, which closes committerDone.
	closing       chan struct{}
	committerDone chan struct{}
	collectors    []prometheus.Collector
	metrics       *metrics
}

type commit struct {
	change store.Change
	done   chan error
}

// defaultStoreRetry is Config.StoreRetry's default: longer than an etcd
// leader election.
const defaultStoreRetry = 10 * time.Second

// The defaults of Config.MaxWaiting and Config.MaxWaitingPerNamespace.
const (
	DefaultMaxWaiting             = 1000
	DefaultMaxWaitingPerNamespace = 100
)

// recentDemands is how many granted demands make up the workload that
// fragmentation (and the FGD-based policies) are measured against.
const recentDemands = 1024

// New recovers the pool from the store: servers are registered again (and
// given a heartbeat timeout from now to check in), leases restored on their
// GPUs, leases whose TTL ran out while the allocator was down expired, and
// the quotas the API set or removed applied over the config's.
func New(ctx context.Context, cfg Config) (*Service, error) {
	for _, bound := range []struct {
		name  string
		value int
	}{{"max-waiting", cfg.MaxWaiting}, {"max-waiting-per-namespace", cfg.MaxWaitingPerNamespace}} {
		if bound.value < 0 {
			return nil, &allocator.FieldError{Field: bound.name, Value: strconv.Itoa(bound.value), Limit: "is negative (0 takes the default)"}
		}
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.StoreRetry == 0 {
		cfg.StoreRetry = defaultStoreRetry
	}
	if cfg.MaxWaiting == 0 {
		cfg.MaxWaiting = DefaultMaxWaiting
	}
	if cfg.MaxWaitingPerNamespace == 0 {
		cfg.MaxWaitingPerNamespace = DefaultMaxWaitingPerNamespace
	}
	s := &Service{
		cfg: cfg, log: cfg.Logger, clock: cfg.Clock, lastSeen: map[string]time.Time{},
		waiting: map[*allocator.Request]*waiter{}, waitingIn: map[string]int{},
		kick: make(chan struct{}, 1), failed: make(chan struct{}),
		closing: make(chan struct{}), committerDone: make(chan struct{}),
	}
	pol, err := allocator.NewPolicy(cfg.Policy, allocator.PolicyOptions{Seed: cfg.Seed})
	if err != nil {
		return nil, err
	}
	if s.pool, err = allocator.NewPool(allocator.PoolConfig{Policy: pol, DefaultTTL: cfg.DefaultTTL, MaxTTL: cfg.MaxTTL}); err != nil {
		return nil, err
	}
	for ns, q := range cfg.Quotas {
		if err := s.pool.SetQuota(ns, q); err != nil {
			return nil, fmt.Errorf("quota of namespace %s: %w", ns, err)
		}
	}
	if err := s.recover(ctx); err != nil {
		return nil, err
	}
	if s.metrics, s.collectors, err = newMetrics(s, cfg.Registry); err != nil {
		return nil, err
	}
	go s.committer() //nolint:gosec // the committer outlives every request: it serves them all
	return s, nil
}

func (s *Service) recover(ctx context.Context) error {
	st, err := s.cfg.Store.Load(ctx)
	if err != nil {
		return fmt.Errorf("loading state from the %s store: %w", s.cfg.Store.Name(), err)
	}
	now := s.clock()
	misfits, expired, err := restore(s.pool, st, now)
	if err != nil {
		return err
	}
	var dropped []string
	for _, m := range misfits {
		s.log.Error("dropping a stored lease that no longer fits", "lease", m.ID, "err", m.Err)
		dropped = append(dropped, m.ID)
	}
	for _, l := range expired {
		dropped = append(dropped, l.ID)
	}
	for _, srv := range st.Servers {
		s.lastSeen[srv.Name] = now
	}
	if len(dropped) > 0 {
		if err := s.cfg.Store.Apply(ctx, []store.Change{{Ended: dropped}}); err != nil {
			return fmt.Errorf("recording leases expired while down: %w", err)
		}
	}
	s.log.Info("recovered state", "store", s.cfg.Store.Name(), "servers", len(st.Servers),
		"leases", len(st.Leases)-len(dropped), "expired_or_dropped", len(dropped))
	return nil
}

// Misfit is a stored lease that could not be put back on its GPUs.
type Misfit struct {
	ID  string
	Err error
}

// restore puts stored state into a pool as recovery does: servers
// registered again, leases on the GPUs they were granted, quotas over
// those the pool has. It returns the leases that no longer fit, and those
// expired by now (ended in the pool).
func restore(pool *allocator.Pool, st store.State, now time.Time) (misfits []Misfit, expired []allocator.Lease, err error) {
	for _, srv := range st.Servers {
		if err := pool.RestoreServer(srv); err != nil {
			return nil, nil, fmt.Errorf("restoring server %s: %w", srv.Name, err)
		}
	}
	for _, q := range st.Quotas {
		if err := applyQuota(pool, q); err != nil {
			return nil, nil, fmt.Errorf("restoring the quota of namespace %s: %w", q.Namespace, err)
		}
	}
	for _, l := range st.Leases {
		if err := pool.Restore(l); err != nil {
			misfits = append(misfits, Misfit{ID: l.ID, Err: err})
		}
	}
	pool.SetNextID(st.NextID)
	return misfits, pool.Expire(now), nil
}

// CheckReport is what CheckState found in a store.
type CheckReport struct {
	Servers, Leases int
	// Expired are leases whose time ran out: recovery would end them.
	Expired int
	// Misfits are leases that do not fit their server's GPUs: recovery
	// would drop them, and the store is inconsistent.
	Misfits []Misfit
	NextID  uint64
}

// CheckState restores stored state into a scratch pool, exactly as a
// starting allocator would, and checks the pool's bookkeeping; nothing is
// written anywhere. It backs `gpupool-allocator --check`.
func CheckState(st store.State, now time.Time) (CheckReport, error) {
	pol, err := allocator.NewPolicy("best-fit", allocator.PolicyOptions{})
	if err != nil {
		return CheckReport{}, err
	}
	pool, err := allocator.NewPool(allocator.PoolConfig{Policy: pol, DefaultTTL: time.Minute, MaxTTL: time.Minute})
	if err != nil {
		return CheckReport{}, err
	}
	misfits, expired, err := restore(pool, st, now)
	if err != nil {
		return CheckReport{}, err
	}
	if err := pool.CheckInvariants(); err != nil {
		return CheckReport{}, fmt.Errorf("restored state breaks the pool's invariants: %w", err)
	}
	return CheckReport{Servers: len(st.Servers), Leases: len(st.Leases), Expired: len(expired), Misfits: misfits, NextID: st.NextID}, nil
}

// Failed is closed when the store failed or a change panicked; the pool
// may then be ahead of what is durable, or half changed, and only a new
// Service, which loads the store, recovers.
func (s *Service) Failed() <-chan struct{} { return s.failed }

// Close stops the service: it takes no more changes, answers those not
// yet written as unavailable, and takes its metrics off the registry, so
// that a new Service may recover from the store (a replica that leads
// again) and register its own.
func (s *Service) Close() {
	s.mu.Lock()
	s.broken.Store(true) // under mu: nothing is queued after this
	s.mu.Unlock()
	select {
	case <-s.closing:
	default:
		close(s.closing)
	}
	<-s.committerDone
	for _, c := range s.collectors {
		s.cfg.Registry.Unregister(c)
	}
}

// committer writes changes in the order they were made, all that are
// waiting per sync (group commit). After a failed write it writes nothing
// more: a later change may depend on one that was lost.
func (s *Service) committer() {
	defer close(s.committerDone)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-s.closing; cancel() }()
	var changes []store.Change
	for {
		select {
		case <-s.kick:
		case <-s.closing:
			s.answerQueued(errUnavailable)
			return
		}
		batch := s.takeQueued()
		if len(batch) == 0 {
			continue
		}
		if s.broken.Load() {
			answer(batch, errUnavailable)
			continue
		}
		changes = changes[:0]
		for _, c := range batch {
			changes = append(changes, c.change)
		}
		// Not a request's context: a batch serves many requests and must
		// finish even when the one that queued first gave up.
		err := s.applyRetrying(ctx, changes)
		if err != nil {
			s.fail(fmt.Errorf("%s store: %w", s.cfg.Store.Name(), err))
		}
		answer(batch, err)
	}
}

// applyRetrying applies a batch, again while the store says the error may
// pass, for up to StoreRetry. Applying it again is safe: a batch is whole
// records put and deleted, and nothing else is written meanwhile.
func (s *Service) applyRetrying(ctx context.Context, changes []store.Change) error {
	giveUp := time.Now().Add(s.cfg.StoreRetry)
	backoff := 50 * time.Millisecond
	for {
		start := time.Now()
		err := s.cfg.Store.Apply(ctx, changes)
		s.metrics.storeApply.Observe(time.Since(start).Seconds())
		if err == nil {
			return nil
		}
		s.metrics.storeErrors.Inc()
		if !errors.Is(err, store.ErrUnavailable) || time.Now().Add(backoff).After(giveUp) {
			return err
		}
		s.log.Warn("store unavailable; retrying the batch", "err", err, "retry_in", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return ctx.Err()
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

func (s *Service) takeQueued() []commit {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	batch := s.queued
	s.queued = nil
	return batch
}

func (s *Service) answerQueued(err error) { answer(s.takeQueued(), err) }

func answer(batch []commit, err error) {
	for _, c := range batch {
		c.done <- err
	}
}

// fail marks the service broken; it takes no lock, so the committer can
// call it whatever the request paths hold.
func (s *Service) fail(err error) {
	s.failOnce.Do(func() {
		s.broken.Store(true)
		s.log.Error("this allocator serves no more until it recovers from the store", "err", err)
		close(s.failed)
	})
}

// queue hands a change to the committer; it must be called with s.mu held
// so that changes reach the store in the order they were made. It never
// blocks.
func (s *Service) queue(c store.Change) chan error {
	done := make(chan error, 1)
	s.qmu.Lock()
	s.queued = append(s.queued, commit{change: c, done: done})
	s.qmu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default: // the committer is already due to look
	}
	return done
}

// durable waits for a queued change to be written.
func durable(ctx context.Context, done chan error) error {
	select {
	case err := <-done:
		if err != nil {
			return errUnavailable
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waiter is a request queued for capacity or quota.
type waiter struct {
	since time.Time
	// shape is what decides whether the request fits: requests of one
	// shape fit or not together, so one try answers for all of them.
	shape shape
	// wake is sent to when the request fits now; it holds one wake-up, so
	// that none sent between its try and its wait is lost.
	wake chan struct{}
}

// shape is a request's demand and namespace (its quota), without its
// owner, key or lifetime. A request that names candidate servers is a
// shape of its own: the list may be a cluster's every node.
type shape struct {
	namespace                    string
	gpus, percent                int
	gpuBytes, cpuMilli, memBytes int64
	models                       string
	link                         allocator.Link
	own                          *allocator.Request
}

func shapeOf(r *allocator.Request) shape {
	sh := shape{namespace: r.Namespace, gpus: r.GPUs, percent: r.Percent, gpuBytes: r.GPUMemoryBytes, cpuMilli: r.CPUMilli,
		memBytes: r.MemoryBytes, models: strings.Join(r.Models, ","), link: r.Topology}
	if len(r.Servers) > 0 {
		sh.own = r
	}
	return sh
}

// wakeLocked wakes the waiting requests that fit now, after share or
// quota freed up: one try of the pool's a shape, where waking every
// waiting request would have each try again, and all but a few fail,
// under the lock every other request needs.
func (s *Service) wakeLocked() {
	fits := map[shape]bool{}
	for r, w := range s.waiting {
		ok, tried := fits[w.shape]
		if !tried {
			ok = s.pool.Fits(*r) == nil
			fits[w.shape] = ok
		}
		if ok {
			select {
			case w.wake <- struct{}{}:
			default: // woken already
			}
		}
	}
}

// write is the one way a change reaches the pool: under the lock, unless
// the store has failed, it runs op with the time, ends the leases due by
// then, and queues what op changed (nothing when op fails) with those
// endings for the committer; then, unlocked, it waits until that is
// durable. It returns op's error, or why the change is not durable.
func (s *Service) write(ctx context.Context, op func(now time.Time) (store.Change, error)) error {
	done, err := s.apply(op)
	if done != nil {
		if derr := durable(ctx, done); derr != nil {
			return derr
		}
	}
	return err
}

// apply is write's part under the lock; done is nil when there is nothing
// to wait for.
//
// A change that panics may have left the pool half changed, and nothing
// of it was queued: the service fails, so that no later change builds on
// that pool, and the allocator recovers from the store, which holds every
// acknowledged change and none of this one. The caller is told to retry.
func (s *Service) apply(op func(now time.Time) (store.Change, error)) (done chan error, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer func() {
		if p := recover(); p != nil {
			s.fail(fmt.Errorf("a change panicked, leaving the pool in an unknown state: %v\n%s", p, debug.Stack()))
			done, err = nil, errUnavailable
		}
	}()
	if s.broken.Load() {
		return nil, errUnavailable
	}
	now := s.clock()
	c, err := op(now)
	if err != nil {
		c = store.Change{}
	}
	if expired := s.pool.Expire(now); len(expired) > 0 {
		for _, l := range expired {
			c.Ended = append(c.Ended, l.ID)
			s.log.Info("lease expired", "lease", l.ID, "namespace", l.Namespace, "pod", l.Owner.Pod, "server", l.Server)
		}
		s.metrics.expirations.Add(float64(len(expired)))
		s.wakeLocked()
	}
	// An answer that a lease is gone may rest on a change not yet durable
	// (a retried release racing the first): it waits for the writes queued
	// before it, as a change does.
	var gone *allocator.LeaseNotFoundError
	if len(c.Servers) > 0 || len(c.Leases) > 0 || len(c.Ended) > 0 || len(c.Quotas) > 0 || c.NextID > 0 || errors.As(err, &gone) {
		done = s.queue(c)
	}
	return done, err
}

// Acquire grants a lease, waiting up to wait for capacity or quota.
func (s *Service) Acquire(ctx context.Context, r allocator.Request, wait time.Duration) (allocator.Lease, error) {
	start := time.Now()
	deadline := start.Add(wait)
	if wait > 0 {
		defer s.notWaiting(&r)
	}
	for {
		var l allocator.Lease
		var replay bool
		var wake chan struct{}
		err := s.write(ctx, func(now time.Time) (store.Change, error) {
			before := s.pool.NextID()
			var err error
			l, err = s.pool.Acquire(now, r)
			if err != nil {
				if wait > 0 && kindOf(err).waitable {
					wake, err = s.queueLocked(&r, start, err)
				}
				return store.Change{}, err
			}
			// An idempotent retry is written again too: its answer waits
			// until the first grant is durable.
			if replay = s.pool.NextID() == before; !replay {
				s.remember(&l)
			}
			return store.Change{Leases: []allocator.Lease{l}, NextID: s.pool.NextID()}, nil
		})
		if err == nil {
			if !replay {
				s.metrics.acquired(start, nil)
			}
			return l, nil
		}
		if !kindOf(err).waitable || !time.Now().Before(deadline) || waitForFreed(ctx, wake, deadline) != nil {
			s.metrics.acquired(start, err)
			return allocator.Lease{}, err
		}
	}
}

// waitForFreed waits until wake says the request fits, the deadline
// passes or ctx ends.
func waitForFreed(ctx context.Context, wake chan struct{}, deadline time.Time) error {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-wake:
		return nil
	case <-t.C:
		return context.DeadlineExceeded
	case <-ctx.Done():
		return ctx.Err()
	}
}

// queueLocked queues r, refused for refusal, to wait for capacity or
// quota, unless it is queued already, and returns what wakes it; past the
// bounds it returns why r is not queued instead of refusal.
func (s *Service) queueLocked(r *allocator.Request, since time.Time, refusal error) (wake chan struct{}, err error) {
	if w, queued := s.waiting[r]; queued {
		return w.wake, refusal
	}
	switch {
	case s.waitingIn[r.Namespace] >= s.cfg.MaxWaitingPerNamespace:
		return nil, &TooManyWaitingError{Refusal: refusal, Namespace: r.Namespace, Limit: "max-waiting-per-namespace", Waiting: s.waitingIn[r.Namespace]}
	case len(s.waiting) >= s.cfg.MaxWaiting:
		return nil, &TooManyWaitingError{Refusal: refusal, Limit: "max-waiting", Waiting: len(s.waiting)}
	}
	w := &waiter{since: since, shape: shapeOf(r), wake: make(chan struct{}, 1)}
	s.waiting[r] = w
	s.waitingIn[r.Namespace]++
	return w.wake, refusal
}

// notWaiting takes a request off the queue that Status shows.
func (s *Service) notWaiting(r *allocator.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, queued := s.waiting[r]; !queued {
		return
	}
	delete(s.waiting, r)
	if s.waitingIn[r.Namespace]--; s.waitingIn[r.Namespace] == 0 {
		delete(s.waitingIn, r.Namespace)
	}
}

// remember records a granted lease's shape for the expected workload (a
// memory request by the share it got); every recentDemands grants the
// frag-based policies are rebuilt on it.
func (s *Service) remember(l *allocator.Lease) {
	d := allocator.Demand{GPUs: len(l.GPUs), CPUMilli: l.CPUMilli}
	if len(l.GPUs) > 0 {
		d.PerGPU = l.GPUs[0].Share
	}
	if len(s.recent) < recentDemands {
		s.recent = append(s.recent, d)
	} else {
		s.recent[s.next] = d
	}
	s.next = (s.next + 1) % recentDemands
	if s.next == 0 {
		s.refreshPolicyLocked()
	}
}

func (s *Service) workloadLocked() allocator.Workload {
	return allocator.TypicalWorkload(s.recent, 0.95)
}

func (s *Service) refreshPolicyLocked() {
	pol, err := allocator.NewPolicy(s.cfg.Policy, allocator.PolicyOptions{Seed: s.cfg.Seed, Workload: s.workloadLocked()})
	if err == nil {
		s.pool.SetPolicy(pol)
	}
}

// Renew extends a lease.
func (s *Service) Renew(ctx context.Context, p Principal, id string, ttl time.Duration) (allocator.Lease, error) {
	var l allocator.Lease
	err := s.write(ctx, func(now time.Time) (store.Change, error) {
		err := s.mayUseLocked(p, id, now)
		if err == nil {
			l, err = s.pool.Renew(now, id, ttl)
		}
		return store.Change{Leases: []allocator.Lease{l}}, err
	})
	return l, err
}

// Release ends a lease.
func (s *Service) Release(ctx context.Context, p Principal, id string) (allocator.Lease, error) {
	var l allocator.Lease
	err := s.write(ctx, func(now time.Time) (store.Change, error) {
		err := s.mayUseLocked(p, id, now)
		if err == nil {
			l, err = s.pool.Release(now, id)
		}
		if err != nil {
			return store.Change{}, err
		}
		s.wakeLocked()
		return store.Change{Ended: []string{id}}, nil
	})
	if err == nil {
		s.metrics.releases.Inc()
	}
	return l, err
}

// Lease returns one lease.
func (s *Service) Lease(p Principal, id string) (allocator.Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, err := s.pool.Lease(s.clock(), id)
	if err != nil {
		return l, err
	}
	if !p.mayRead(&l) {
		// Not 403: that would tell which IDs other namespaces hold.
		return allocator.Lease{}, &allocator.LeaseNotFoundError{ID: id}
	}
	return l, nil
}

// mayUseLocked checks that a live lease is one the principal may renew or
// release; another namespace's is not found, as for Lease.
func (s *Service) mayUseLocked(p Principal, id string, now time.Time) error {
	l, err := s.pool.Lease(now, id)
	if err == nil && !p.mayUse(l.Namespace) {
		err = &allocator.LeaseNotFoundError{ID: id}
	}
	return err
}

// LeaseFilter selects leases to list.
type LeaseFilter struct {
	Namespace string
	Server    string
	// OwnerUID selects the leases of one owner (a pod's UID).
	OwnerUID string
	Selector func(labels map[string]string) bool
}

// Leases lists the live leases that match f.
func (s *Service) Leases(f LeaseFilter) []allocator.Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	var leases []allocator.Lease
	if f.Server != "" { // each daemon's every round: its server's, not a copy of the pool's
		leases = s.pool.LeasesOn(now, f.Server)
	} else {
		leases = s.pool.Leases(now)
	}
	var out []allocator.Lease
	for _, l := range leases {
		if f.Namespace != "" && l.Namespace != f.Namespace || f.Server != "" && l.Server != f.Server ||
			f.OwnerUID != "" && l.Owner.UID != f.OwnerUID || f.Selector != nil && !f.Selector(l.Owner.Labels) {
			continue
		}
		out = append(out, l)
	}
	return out
}

// Quotas lists quota and use per namespace.
func (s *Service) Quotas() []allocator.QuotaStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pool.Quotas(s.clock())
}

// SetQuota sets the GPU share a namespace's leases may hold in all, and
// returns the namespace's quota and use. A quota below what the namespace
// holds keeps its leases and admits no new ones; a raised one wakes the
// requests that wait. The store keeps it, over the config file's.
func (s *Service) SetQuota(ctx context.Context, namespace string, hard allocator.Share) (allocator.QuotaStatus, error) {
	return s.putQuota(ctx, store.Quota{Namespace: namespace, Limited: true, Hard: hard})
}

// DeleteQuota removes a namespace's quota: it is unlimited from then on,
// across restarts too, whatever the config file says.
func (s *Service) DeleteQuota(ctx context.Context, namespace string) (allocator.QuotaStatus, error) {
	return s.putQuota(ctx, store.Quota{Namespace: namespace})
}

func (s *Service) putQuota(ctx context.Context, q store.Quota) (allocator.QuotaStatus, error) {
	var after allocator.QuotaStatus
	err := s.write(ctx, func(now time.Time) (store.Change, error) {
		before := s.pool.Quota(now, q.Namespace)
		if err := applyQuota(s.pool, q); err != nil {
			return store.Change{}, err
		}
		if before.Limited && (!q.Limited || q.Hard > before.Hard) {
			s.wakeLocked()
		}
		after = s.pool.Quota(now, q.Namespace)
		return store.Change{Quotas: []store.Quota{q}}, nil
	})
	return after, err
}

// applyQuota sets or removes a namespace's quota as q says.
func applyQuota(pool *allocator.Pool, q store.Quota) error {
	if q.Limited {
		return pool.SetQuota(q.Namespace, q.Hard)
	}
	return pool.RemoveQuota(q.Namespace)
}

// RegisterServer adds or updates a GPU server; it counts as a heartbeat.
func (s *Service) RegisterServer(ctx context.Context, srv allocator.Server) error {
	return s.write(ctx, func(now time.Time) (store.Change, error) {
		if err := s.pool.RegisterServer(srv); err != nil {
			return store.Change{}, err
		}
		s.lastSeen[srv.Name] = now
		_, _ = s.pool.SetSchedulable(srv.Name, true)
		s.wakeLocked()
		return store.Change{Servers: []allocator.Server{srv}}, nil
	})
}

// Heartbeat records that a server is alive and updates its GPUs' health.
func (s *Service) Heartbeat(ctx context.Context, name string, hb api.Heartbeat) error {
	return s.write(ctx, func(now time.Time) (store.Change, error) {
		srv, known := s.pool.Server(name)
		if !known {
			return store.Change{}, &allocator.ServerNotFoundError{Name: name}
		}
		changed := false
		for _, g := range hb.GPUs {
			if g.Index < 0 || g.Index >= len(srv.GPUs) {
				limit := fmt.Sprintf("out of range 0..%d", len(srv.GPUs)-1)
				if len(srv.GPUs) == 0 {
					limit = "names a GPU, but server " + srv.Name + " registered none"
				}
				return store.Change{}, &allocator.FieldError{Field: "gpus.index", Value: fmt.Sprint(g.Index), Limit: limit}
			}
			if srv.GPUs[g.Index].Healthy != g.Healthy {
				srv.GPUs[g.Index].Healthy, changed = g.Healthy, true
			}
		}
		s.lastSeen[name] = now
		if back, _ := s.pool.SetSchedulable(name, true); back {
			s.wakeLocked() // back after silence: queued requests may fit now
		}
		if !changed {
			return store.Change{}, nil
		}
		for i, g := range srv.GPUs {
			if err := s.pool.SetGPUHealth(name, i, g.Healthy); err != nil {
				return store.Change{}, err
			}
		}
		s.wakeLocked()
		return store.Change{Servers: []allocator.Server{srv}}, nil
	})
}

// Run expires leases and marks silent servers until ctx ends.
func (s *Service) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.tick()
		}
	}
}

// tick marks the servers silent for longer than the heartbeat timeout;
// the write ends the leases whose time ran out.
func (s *Service) tick() {
	_ = s.write(context.Background(), func(now time.Time) (store.Change, error) {
		for name, seen := range s.lastSeen {
			if now.Sub(seen) > s.cfg.HeartbeatTimeout {
				_, _ = s.pool.SetSchedulable(name, false)
			}
		}
		return store.Change{}, nil
	})
}

// Status reports the pool for `gpupool pool status`.
func (s *Service) Status() api.PoolStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	leases := map[string]int{}
	for _, l := range s.pool.Leases(s.clock()) {
		leases[l.Server]++
	}
	var st api.PoolStatus
	for _, state := range s.pool.ServerStates() {
		st.Servers = append(st.Servers, s.serverStatus(&state, leases[state.Server.Name]))
	}
	for r, w := range s.waiting {
		st.Pending = append(st.Pending, api.PendingRequest{Namespace: r.Namespace, Owner: api.NewOwner(r.Owner), GPUs: r.GPUs,
			Percent: r.Percent, GPUMemoryBytes: r.GPUMemoryBytes, Since: w.since})
	}
	slices.SortFunc(st.Pending, func(a, b api.PendingRequest) int { return a.Since.Compare(b.Since) })
	return st
}

// Server reports one server as Status does: what the node side of a
// GPU server polls, which would be the whole pool's status times the
// number of servers if it read Status.
func (s *Service) Server(name string) (api.ServerStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	state, known := s.pool.ServerState(name)
	if !known {
		return api.ServerStatus{}, &allocator.ServerNotFoundError{Name: name}
	}
	return s.serverStatus(&state, len(s.pool.LeasesOn(s.clock(), name))), nil
}

// serverStatus is one server and what is leased on it; s.mu is held.
func (s *Service) serverStatus(state *allocator.ServerState, leases int) api.ServerStatus {
	srv, n := &state.Server, &state.Node
	ss := api.ServerStatus{
		Name: srv.Name, Labels: srv.Labels, Schedulable: n.Schedulable, LastHeartbeat: s.lastSeen[srv.Name],
		CPUMilli: n.CPUCap, CPUFreeMilli: n.CPUFree, Leases: leases,
	}
	for gi, g := range srv.GPUs {
		ng := &n.GPUs[gi]
		ss.GPUs = append(ss.GPUs, api.GPUStatus{
			Index: g.Index, UUID: g.UUID, Model: g.Model, MemoryBytes: g.MemoryBytes, Healthy: ng.Healthy,
			AllocatedPercent: (allocator.WholeGPU - ng.Free).Percent(), AllocatedBytes: ng.MemoryBytes - ng.FreeBytes,
		})
	}
	return ss
}

// CheckInvariants checks the pool's bookkeeping (tests and debugging).
func (s *Service) CheckInvariants() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pool.CheckInvariants()
}

func (s *Service) pendingCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiting)
}

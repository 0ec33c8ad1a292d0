// Package service runs the allocator core as a service: it serializes
// operations on the pool, makes every change durable through a store before
// it is acknowledged, expires leases and marks servers whose heartbeat
// stopped, queues requests that asked to wait, and serves it all over HTTP.
//
// One file a job: service.go the one path of every change (write, apply);
// recovery.go the state loaded from the store; commit.go the group commit;
// leases.go, quotas.go and servers.go the operations; waiting.go the
// requests queued for capacity or quota; use.go and console.go what the
// daemons measure and the console shows; http.go, errors.go and
// strictjson.go the API, config.go its tokens, metrics.go its series;
// leadership.go a replica's terms as the leader that serves them.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
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
	// IdlePolicies are the namespaces' idle policies, the config file's;
	// DefaultIdlePolicy for a namespace without one.
	IdlePolicies map[string]IdlePolicy
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
	estimate  allocator.WorkloadEstimate // the expected workload, learnt from grants
	// use is each server's latest measured use, idleRuns since when each
	// lease has been measured idle (idle.go), history the pool's shares
	// over the last hour: in memory only (use.go), so that a restart
	// starts every idle run again.
	use       map[string]*serverUse
	idleRuns  map[string]*idleRun
	notIdleAt map[string]time.Time
	history   history
	// console is the last view of every namespace the console read,
	// rebuilt at most once per consoleMaxAge, and consoleEncoded its JSON
	// by scope and encoding (console.go).
	consoleMu      sync.Mutex
	console        *api.Console
	consoleEncoded map[consoleKey][]byte

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
		cfg: cfg, log: cfg.Logger, clock: cfg.Clock, lastSeen: map[string]time.Time{}, use: map[string]*serverUse{}, idleRuns: map[string]*idleRun{}, notIdleAt: map[string]time.Time{},
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

// CheckInvariants checks the pool's bookkeeping (tests and debugging).
func (s *Service) CheckInvariants() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pool.CheckInvariants()
}

package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpupool/gpupool/allocator/store"
)

// Leadership is the allocator's HTTP handler across its terms as leader:
// while a term lasts it serves the API of a Service recovered from the
// store; the rest of the time it stands by, answering the API 503 so that
// clients try another replica. Each term recovers anew, so a replica that
// leads again starts from what the store holds, never from its memory.
type Leadership struct {
	cfg     LeadershipConfig
	log     *slog.Logger
	leader  prometheus.Gauge
	standby http.Handler
	current atomic.Pointer[http.Handler]
}

// LeadershipConfig configures a Leadership.
type LeadershipConfig struct {
	// Service configures each term's service; the term sets its Store.
	// Its Registry (which also takes the leader gauge) and Logger must be
	// set.
	Service Config
	// Auth authenticates the API's requests; nil lets every request act as
	// admin.
	Auth *Authenticator
	// Gatherer serves /metrics, leading or not.
	Gatherer prometheus.Gatherer
	// Tick is how often leases are expired and heartbeats checked.
	Tick time.Duration
	// Drain (required) stops the HTTP server once the requests in flight
	// are answered. A term that ends because ctx ended drains before its service closes,
	// so that those requests are answered by it, not told to try again.
	Drain func()
}

// NewLeadership returns a Leadership that stands by, and registers the
// leader gauge.
func NewLeadership(cfg LeadershipConfig) (*Leadership, error) {
	leaders := LeaderFamily.NewGaugeVec()
	if err := cfg.Service.Registry.Register(leaders); err != nil {
		return nil, fmt.Errorf("registering %s: %w", LeaderFamily.Name, err)
	}
	l := &Leadership{cfg: cfg, log: cfg.Service.Logger, leader: leaders.WithLabelValues(),
		standby: StandbyHandler(cfg.Gatherer, cfg.Service.Logger)}
	l.current.Store(&l.standby)
	return l, nil
}

// ServeHTTP answers with the current term's API, or the standby answer.
func (l *Leadership) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	(*l.current.Load()).ServeHTTP(w, r)
}

// errLostLeadership ends a term whose etcd session ended.
var errLostLeadership = errors.New("lost leadership (etcd session ended)")

// Serve serves one term: it recovers a service from st and serves it until
// ctx ends (nil), the service fails or lost is closed (why). Then the
// standby answer is back, and the service is closed: requests it had not
// made durable are told to try again, elsewhere. A store without elections
// (bolt) has a nil lost: its one term lasts as long as the process.
func (l *Leadership) Serve(ctx context.Context, st store.Store, lost <-chan struct{}) error {
	cfg := l.cfg.Service
	cfg.Store = st
	svc, err := New(ctx, cfg)
	if err != nil {
		return fmt.Errorf("starting the allocator: %w", err)
	}
	termCtx, endTerm := context.WithCancel(ctx)
	defer endTerm()
	go svc.Run(termCtx, l.cfg.Tick)
	serving := Handler(svc, l.cfg.Auth, l.cfg.Gatherer, l.log)
	l.current.Store(&serving)
	l.leader.Set(1)
	l.log.Info("allocator ready", "store", st.Name())

	select {
	case <-ctx.Done():
		l.cfg.Drain()
	case <-svc.Failed():
		err = errors.New("the service failed (its log says why)")
	case <-lost:
		err = errLostLeadership
	}
	l.leader.Set(0)
	l.current.Store(&l.standby)
	svc.Close()
	return err
}

// Elector is a store shared by replicas that elects the one that leads
// and writes: *store.Etcd.
type Elector interface {
	store.Store
	// Campaign blocks until this replica leads (or ctx ends).
	Campaign(ctx context.Context, id string) error
	// Lost is closed when this replica no longer leads.
	Lost() <-chan struct{}
	// StepDown gives up leadership; the next Campaign starts afresh.
	StepDown() error
}

// Election is this replica's candidacy in an Elector.
type Election struct {
	Elector Elector
	// ID names this replica to the others: the elector records the
	// leader's.
	ID string
	// Endpoints say where the election is held (etcd's), for the log.
	Endpoints string
}

// retryDelay is how long a replica waits to campaign again after a
// campaign or a term failed, so that a fault that persists is not retried
// in a busy loop.
const retryDelay = time.Second

// ServeTerms campaigns in e and serves a term each time this replica
// leads, until ctx ends. A term that ends in error steps down: whatever
// ended it, the next term starts from what the store holds, as this
// replica's memory may be behind it.
func (l *Leadership) ServeTerms(ctx context.Context, e Election) {
	for ctx.Err() == nil {
		l.log.Info("standing by for leadership", "etcd", e.Endpoints)
		if err := e.Elector.Campaign(ctx, e.ID); err != nil {
			if ctx.Err() == nil {
				l.log.Error("campaigning for leadership; trying again", "err", err)
				sleep(ctx, retryDelay)
			}
			continue
		}
		l.log.Info("leading")
		if err := l.Serve(ctx, e.Elector, e.Elector.Lost()); err != nil && ctx.Err() == nil {
			l.log.Error("stepping down; campaigning again", "err", err)
			_ = e.Elector.StepDown()
			sleep(ctx, retryDelay)
		}
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

package service

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpupool/gpupool/allocator/store"
)

// fakeElector is a bolt store with an election the test decides: a
// campaign leads once the test sends on lead, and leadership is lost when
// the test closes lost.
type fakeElector struct {
	store.Store
	campaigns chan string // the ID of each campaign, as it starts
	lead      chan struct{}
	lost      chan struct{}
	stepDowns atomic.Int32
}

func newFakeElector(t *testing.T) *fakeElector {
	t.Helper()
	b, err := store.OpenBolt(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return &fakeElector{Store: b, campaigns: make(chan string, 10), lead: make(chan struct{}), lost: make(chan struct{})}
}

func (f *fakeElector) Campaign(ctx context.Context, id string) error {
	f.campaigns <- id
	select {
	case <-f.lead:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *fakeElector) Lost() <-chan struct{} { return f.lost }
func (f *fakeElector) StepDown() error       { f.stepDowns.Add(1); return nil }

// newTestLeadership is a Leadership on a fresh registry; drain is its
// Drain.
func newTestLeadership(t *testing.T, drain func()) *Leadership {
	t.Helper()
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	l, err := NewLeadership(LeadershipConfig{
		Service:  Config{Policy: "best-fit", DefaultTTL: time.Minute, MaxTTL: time.Hour, HeartbeatTimeout: time.Minute, Registry: reg, Logger: log},
		Gatherer: reg, Tick: time.Hour, Drain: drain})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// poolStatus is the status of GET /v1/pool from h.
func poolStatus(h http.Handler) int {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/pool", nil))
	return w.Code
}

// await fails the test unless ok holds within 5 s.
func await(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5 s", what)
		}
	}
}

// TestLeadershipServesOnlyWhileLeading: a replica answers the API 503
// until it leads, serves it while it leads, and when its leadership is
// lost it stands by again, steps down and campaigns again.
func TestLeadershipServesOnlyWhileLeading(t *testing.T) {
	l := newTestLeadership(t, func() {})
	if code, leader := poolStatus(l), testutil.ToFloat64(l.leader); code != http.StatusServiceUnavailable || leader != 0 {
		t.Fatalf("before leading: API %d, leader %v; want 503 and 0", code, leader)
	}
	e := newFakeElector(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.ServeTerms(ctx, Election{Elector: e, ID: "replica-1", Endpoints: "etcd:2379"}); close(done) }()

	if id := <-e.campaigns; id != "replica-1" {
		t.Errorf("campaigned as %q, want replica-1", id)
	}
	e.lead <- struct{}{}
	await(t, "the API served once leading", func() bool { return poolStatus(l) == http.StatusOK })
	if leader := testutil.ToFloat64(l.leader); leader != 1 {
		t.Errorf("leading: leader gauge %v, want 1", leader)
	}

	close(e.lost)
	select {
	case <-e.campaigns:
	case <-time.After(5 * time.Second):
		t.Fatal("no new campaign after leadership was lost")
	}
	if code, leader, steps := poolStatus(l), testutil.ToFloat64(l.leader), e.stepDowns.Load(); code != http.StatusServiceUnavailable || leader != 0 || steps != 1 {
		t.Errorf("after losing leadership: API %d, leader %v, %d step-downs; want 503, 0 and 1", code, leader, steps)
	}

	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("ServeTerms did not return once its context ended")
	}
}

// TestTermDrainsBeforeItsServiceCloses: a term that ends with the process
// lets the requests in flight be answered by its service before it closes
// it, then stands by.
func TestTermDrainsBeforeItsServiceCloses(t *testing.T) {
	var l *Leadership
	drainedWhileServing := make(chan int, 1)
	l = newTestLeadership(t, func() { drainedWhileServing <- poolStatus(l) })
	e := newFakeElector(t)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- l.Serve(ctx, e, nil) }()
	await(t, "the API served", func() bool { return poolStatus(l) == http.StatusOK })

	cancel()
	if err := <-served; err != nil {
		t.Errorf("a term ended by its context: %v, want nil", err)
	}
	select {
	case code := <-drainedWhileServing:
		if code != http.StatusOK {
			t.Errorf("while draining the API answered %d, want 200 from the term's service", code)
		}
	default:
		t.Error("the term ended without draining")
	}
	if code := poolStatus(l); code != http.StatusServiceUnavailable {
		t.Errorf("after the term: API %d, want 503", code)
	}
}

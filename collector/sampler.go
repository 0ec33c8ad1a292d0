package collector

import (
	"context"
	"sync/atomic"
	"time"
)

// Snapshot is one sampling round of a source.
type Snapshot struct {
	// Round numbers the rounds from 1; 0 is the empty snapshot a sampler
	// holds before its first round.
	Round    int
	Time     time.Time
	Duration time.Duration
	Reading
	// ProcessRound is the round that read the process lists the GPUs
	// carry, 0 when they carry none: a list read before a lease appeared
	// says nothing of what the lease runs.
	ProcessRound int
	// Err is the round's failure; Reading and Time are then the last good
	// round's.
	Err error
}

// Sampler samples one source on its own loop and keeps the latest
// snapshot for scrapes to read.
type Sampler struct {
	source Source
	// Interval is the time between rounds; every ProcessEvery-th round
	// also reads the processes.
	Interval     time.Duration
	ProcessEvery int
	clock        func() time.Time
	latest       atomic.Pointer[Snapshot]
	started      atomic.Int64
	// wantAfter is the round after which one must read the processes
	// (RequestProcesses).
	wantAfter atomic.Int64
	// AfterRound, when set before Run, is called after each round: the
	// exporters render their series there, so scrapes only copy them.
	AfterRound func()
}

// NewSampler samples source every interval, processes every processEvery
// rounds; clock is time.Now when nil.
func NewSampler(source Source, interval time.Duration, processEvery int, clock func() time.Time) *Sampler {
	if clock == nil {
		clock = time.Now
	}
	s := &Sampler{source: source, Interval: interval, ProcessEvery: max(processEvery, 1), clock: clock}
	s.latest.Store(&Snapshot{})
	return s
}

// Source returns what the sampler samples.
func (s *Sampler) Source() Source { return s.source }

// Latest returns the last snapshot (empty, Round 0, before the first round).
func (s *Sampler) Latest() *Snapshot { return s.latest.Load() }

// RequestProcesses has a round that starts after the call read the
// processes, whatever ProcessEvery says, and returns the number of rounds
// started before it: a snapshot whose ProcessRound is higher read its
// processes after the call. The daemon calls it when leases appear, so
// that their use is known a round later, not ProcessEvery rounds later.
func (s *Sampler) RequestProcesses() int {
	n := s.started.Load()
	s.wantAfter.Store(n)
	return int(n)
}

// Round samples once. Until a round has read process lists, every round
// asks for them.
func (s *Sampler) Round(ctx context.Context) {
	prev := s.latest.Load()
	n := int(s.started.Add(1))
	withProcs := prev.ProcessRound <= int(s.wantAfter.Load()) || (n-1)%s.ProcessEvery == 0
	start := time.Now()
	reading, err := s.source.Sample(ctx, withProcs)
	snap := &Snapshot{Round: n, Time: s.clock(), Duration: time.Since(start), Reading: reading, Err: err}
	switch {
	case err != nil:
		snap.Reading, snap.Time, snap.ProcessRound = prev.Reading, prev.Time, prev.ProcessRound
	case !withProcs:
		// Keep the processes of the round that read them.
		carryProcesses(snap.GPUs, prev.GPUs)
		snap.ProcessRound = prev.ProcessRound
	case readProcesses(snap.GPUs):
		snap.ProcessRound = n
	}
	s.latest.Store(snap)
	if s.AfterRound != nil {
		s.AfterRound()
	}
}

// readProcesses is whether the source gave any GPU's process list.
func readProcesses(gpus []GPU) bool {
	for i := range gpus {
		if gpus[i].Processes != nil {
			return true
		}
	}
	return false
}

func carryProcesses(now, before []GPU) {
	byUUID := make(map[string][]Process, len(before))
	for i := range before {
		byUUID[before[i].UUID] = before[i].Processes
	}
	for i := range now {
		if now[i].Processes == nil {
			now[i].Processes = byUUID[now[i].UUID]
		}
	}
}

// Run samples until ctx ends.
func (s *Sampler) Run(ctx context.Context) {
	t := time.NewTicker(s.Interval)
	defer t.Stop()
	for {
		s.Round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

package collector

import (
	"context"
	"sync/atomic"
	"time"
)

// Snapshot is one sampling round of a source.
type Snapshot struct {
	Time     time.Time
	Duration time.Duration
	GPUs     []GPU
	// Err is the round's failure; GPUs then holds the last good round's.
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
	rounds       int
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

// Latest returns the last snapshot (zero before the first round).
func (s *Sampler) Latest() *Snapshot { return s.latest.Load() }

// Round samples once.
func (s *Sampler) Round(ctx context.Context) {
	prev := s.latest.Load()
	withProcs := s.rounds%s.ProcessEvery == 0
	s.rounds++
	start := time.Now()
	gpus, err := s.source.Sample(ctx, withProcs)
	snap := &Snapshot{Time: s.clock(), Duration: time.Since(start), GPUs: gpus, Err: err}
	switch {
	case err != nil:
		snap.GPUs, snap.Time = prev.GPUs, prev.Time
	case !withProcs:
		// Keep the processes of the round that read them.
		carryProcesses(snap.GPUs, prev.GPUs)
	}
	s.latest.Store(snap)
	if s.AfterRound != nil {
		s.AfterRound()
	}
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

package service

import (
	"fmt"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
)

// IdlePolicy is what a namespace's platform team decides of leases that
// hold GPUs and do not use them. It lives in the allocator's config file,
// beside the namespace's quota and tokens, where no tenant writes.
//
//	namespaces:
//	  ml:
//	    idle: {useBelow: 0.1, window: 30m, grace: 15m, action: reclaim}
type IdlePolicy struct {
	// UseBelow: a measured sample whose use of the lease's share is under
	// it is idle (0.1: under 10% of what the lease holds).
	UseBelow float64 `json:"useBelow"`
	// Window: how long a lease must be measured idle, every sample of it,
	// to count as idle. Any sample at or above UseBelow, and any sample
	// whose use is unknown, starts it again.
	Window metav1.Duration `json:"window"`
	// Grace: how long after the window a reclaimed lease's holder has to
	// use it again (the warning's deadline).
	Grace metav1.Duration `json:"grace"`
	// Action: IdleReport (the default) reports an idle lease; IdleReclaim
	// also gives its GPUs back after the grace.
	Action string `json:"action"`
}

// The actions of an IdlePolicy.
const (
	IdleReport  = "report"
	IdleReclaim = "reclaim"
)

// DefaultIdlePolicy is the policy of a namespace the config gives none:
// the console's "idle but held", reported and never acted on.
var DefaultIdlePolicy = IdlePolicy{UseBelow: api.IdleUse, Window: metav1.Duration{Duration: api.IdleWindow}, Action: IdleReport}

// The bounds of an IdlePolicy: a window of at least six samples, so that
// one sample's noise decides nothing, and at most a week for either wait.
const (
	minIdleWindow = 6 * api.HistoryInterval
	maxIdleWait   = 7 * 24 * time.Hour
)

// validate checks p, named field in its errors; an empty Action is
// IdleReport.
func (p *IdlePolicy) validate(field string) error {
	switch {
	case !(p.UseBelow > 0 && p.UseBelow <= 1):
		return &allocator.FieldError{Field: field + ".useBelow", Value: strconv.FormatFloat(p.UseBelow, 'g', -1, 64),
			Limit: "out of range (0, 1]: the use of the lease's share under which it is idle (0.1 is 10%)"}
	case p.Window.Duration < minIdleWindow || p.Window.Duration > maxIdleWait:
		return &allocator.FieldError{Field: field + ".window", Value: p.Window.Duration.String(),
			Limit: fmt.Sprintf("out of range %v..%v (six samples, %v apart, to a week)", minIdleWindow, maxIdleWait, api.HistoryInterval)}
	case p.Grace.Duration < 0 || p.Grace.Duration > maxIdleWait:
		return &allocator.FieldError{Field: field + ".grace", Value: p.Grace.Duration.String(), Limit: fmt.Sprintf("out of range 0..%v", maxIdleWait)}
	}
	switch p.Action {
	case "":
		p.Action = IdleReport
	case IdleReport, IdleReclaim:
	default:
		return &allocator.FieldError{Field: field + ".action", Value: strconv.Quote(p.Action), Limit: "must be " + IdleReport + " or " + IdleReclaim}
	}
	return nil
}

// idlePolicy is namespace ns's policy; s.mu is held or the policies are
// read only.
func (s *Service) idlePolicy(ns string) IdlePolicy {
	if p, ok := s.cfg.IdlePolicies[ns]; ok {
		return p
	}
	return DefaultIdlePolicy
}

// idleRun is a lease's run of measured idle samples: since when it has
// been idle. A lease without one is in use, or not measured.
type idleRun struct{ since time.Time }

// sampleIdle adds one sample of lease l's use, known or not, at now;
// s.mu is held. Each idle sample counts for the interval before it, from
// the grant at the earliest.
func (s *Service) sampleIdle(l *allocator.Lease, use float64, known bool, now time.Time) {
	if !known || use >= s.idlePolicy(l.Namespace).UseBelow {
		delete(s.idleRuns, l.ID) // unknown is never idle
		return
	}
	if s.idleRuns[l.ID] == nil {
		since := now.Add(-api.HistoryInterval)
		for _, t := range []time.Time{l.GrantedAt, s.notIdleAt[l.ID]} {
			if since.Before(t) {
				since = t
			}
		}
		s.idleRuns[l.ID] = &idleRun{since: since}
	}
}

// endRunsNotIdle ends the idle run of each of leases (one server's) that
// its server's reading at now shows in use, or does not read: a daemon
// heart-beats every 5 s and the samples come every 10, so a reading the
// next sample never sees still counts; the run that starts after it starts
// after it. s.mu is held.
func (s *Service) endRunsNotIdle(now time.Time, leases []allocator.Lease) {
	for i := range leases {
		l := &leases[i]
		if use, known := s.useOf(l, now); !known || use >= s.idlePolicy(l.Namespace).UseBelow {
			delete(s.idleRuns, l.ID)
			s.notIdleAt[l.ID] = now
		}
	}
}

// IdleVerdicts are the idle verdicts of leases, in order, under one lock:
// nil for a lease in use or not measured.
func (s *Service) IdleVerdicts(leases []allocator.Lease) []*api.LeaseIdle {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	out := make([]*api.LeaseIdle, len(leases))
	for i := range leases {
		out[i] = s.idleVerdict(&leases[i], now)
	}
	return out
}

// idleVerdict is lease l's run of idle samples at now and what its
// namespace's policy makes of it, nil while it is in use or not measured;
// s.mu is held.
func (s *Service) idleVerdict(l *allocator.Lease, now time.Time) *api.LeaseIdle {
	run := s.idleRuns[l.ID]
	if run == nil {
		return nil
	}
	p := s.idlePolicy(l.Namespace)
	idleFor := now.Sub(run.since)
	v := &api.LeaseIdle{Since: run.since, Seconds: idleFor.Seconds(), UseBelow: p.UseBelow, Window: api.Duration(p.Window.Duration),
		Whole: idleFor >= p.Window.Duration, Action: p.Action}
	if p.Action == IdleReclaim {
		v.ReclaimAt = run.since.Add(p.Window.Duration + p.Grace.Duration)
	}
	return v
}

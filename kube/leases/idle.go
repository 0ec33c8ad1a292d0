package leases

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
)

// EventIdle is the reason of the Warning Event on a pod whose lease the
// allocator measured idle for its namespace's whole idle window.
const EventIdle = "IdleGPUs"

// DefaultIdleEvery is Config.IdleEvery when 0: a tenth of the shortest
// idle window, so that a warning comes within a tenth of it.
const DefaultIdleEvery = 10 * time.Second

// warnIdle writes a Warning Event on the pod of each lease the allocator
// measures idle for its namespace's whole window, once per run of idle
// samples: `kubectl describe pod` then says since when, under which bar,
// and what the policy does. Only the worker calls it.
func (c *Controller) warnIdle(ctx context.Context) error {
	ls, err := c.alloc.Leases(ctx, client.LeaseFilter{Idle: true})
	if err := c.reached(err); err != nil {
		return err
	}
	runs := make(map[string]time.Time, len(ls))
	for i := range ls {
		l := &ls[i]
		if l.Idle == nil || !l.Idle.Whole || !podLease(l) {
			continue
		}
		runs[l.ID] = l.Idle.Since
		if since, warned := c.warned[l.ID]; warned && since.Equal(l.Idle.Since) {
			continue
		}
		pod, err := c.livePod(ctx, l.Namespace, l.Owner.Pod, types.UID(l.Owner.UID))
		if err != nil {
			return err
		}
		if pod != nil {
			c.record.Event(pod, corev1.EventTypeWarning, EventIdle, idleMessage(l.Idle))
		}
	}
	c.warned = runs
	return nil
}

// idleMessage says what the policy makes of an idle lease: "idle for 30m
// (use under 10% of its GPU share); its GPUs are reclaimed at 14:05:00Z
// unless used".
func idleMessage(idle *api.LeaseIdle) string {
	what := fmt.Sprintf("idle for %v (use under %.0f%% of its GPU share since %s)",
		time.Duration(idle.Seconds*float64(time.Second)).Round(time.Second), idle.UseBelow*100, idle.Since.UTC().Format(time.RFC3339))
	if idle.ReclaimAt.IsZero() {
		return what + "; its namespace's idle policy reports it, and reclaims nothing"
	}
	return what + "; its GPUs are reclaimed at " + idle.ReclaimAt.UTC().Format(time.RFC3339) + " unless used"
}

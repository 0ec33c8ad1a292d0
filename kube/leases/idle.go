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

// actOnIdle writes a Warning Event on the pod of each lease the allocator
// measures idle for its namespace's whole window, once per run of idle
// samples, so that `kubectl describe pod` says since when, under which
// bar and what the policy does; and, once per run, reclaims the pod of a
// lease whose policy reclaims it past its deadline. Only the worker calls
// it.
func (c *Controller) actOnIdle(ctx context.Context) (err error) {
	ls, err := c.alloc.Leases(ctx, client.LeaseFilter{Idle: true})
	if err := c.reached(err); err != nil {
		return err
	}
	warned, reclaimed := make(map[string]time.Time, len(ls)), map[string]time.Time{}
	defer func() {
		if err != nil { // the leases not reached keep what was done
			keep(warned, c.warned)
			keep(reclaimed, c.reclaimed)
		}
		c.warned, c.reclaimed = warned, reclaimed
	}()
	for i := range ls {
		l := &ls[i]
		if l.Idle == nil || !l.Idle.Whole || !podLease(l) {
			continue
		}
		since := l.Idle.Since
		wasWarned := c.warned[l.ID].Equal(since)
		if wasWarned {
			warned[l.ID] = since
		}
		// The allocator's now: the run's start and its length.
		due := !l.Idle.ReclaimAt.IsZero() && !since.Add(time.Duration(l.Idle.Seconds*float64(time.Second))).Before(l.Idle.ReclaimAt)
		if done, ok := c.reclaimed[l.ID]; ok && done.Equal(since) {
			reclaimed[l.ID] = since
			continue
		}
		if wasWarned && !due {
			continue
		}
		pod, err := c.livePod(ctx, l.Namespace, l.Owner.Pod, types.UID(l.Owner.UID))
		if err != nil {
			return err
		}
		if pod == nil {
			continue
		}
		// What reclaiming would act on, read only where the policy reclaims.
		var w workload
		exempt := ""
		if !l.Idle.ReclaimAt.IsZero() {
			if w, err = c.workloadOf(ctx, pod); err != nil {
				return err
			}
			exempt = w.exemption(pod)
		}
		if !wasWarned {
			c.record.Event(pod, corev1.EventTypeWarning, EventIdle, idleMessage(l.Idle, exempt))
			warned[l.ID] = since
		}
		if due && exempt == "" {
			done, err := c.reclaim(ctx, pod, w)
			if err != nil {
				return err
			}
			if done {
				reclaimed[l.ID] = since
			}
		} else if due {
			reclaimed[l.ID] = since // its warning said it stays
		}
	}
	return nil
}

// keep adds to runs the entries of old it lacks.
func keep(runs, old map[string]time.Time) {
	for id, since := range old {
		if _, ok := runs[id]; !ok {
			runs[id] = since
		}
	}
}

// idleMessage says what the policy makes of an idle lease: "idle for 30m
// (use under 10% of its GPU share); its GPUs are reclaimed at 14:05:00Z
// unless used"; exempt, where the platform team exempted it, says where.
func idleMessage(idle *api.LeaseIdle, exempt string) string {
	what := fmt.Sprintf("idle for %v (use under %.0f%% of its GPU share since %s)",
		time.Duration(idle.Seconds*float64(time.Second)).Round(time.Second), idle.UseBelow*100, idle.Since.UTC().Format(time.RFC3339))
	if idle.ReclaimAt.IsZero() {
		return what + "; its namespace's idle policy reports it, and reclaims nothing"
	}
	if exempt != "" {
		return what + "; exempt from its namespace's idle reclaim (" + exempt + "): its GPUs stay"
	}
	return what + "; its GPUs are reclaimed at " + idle.ReclaimAt.UTC().Format(time.RFC3339) + " unless used"
}

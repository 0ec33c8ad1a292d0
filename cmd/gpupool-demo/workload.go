package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
)

// demoDemand drives the simulated GPUs: the training group's load rises
// and falls over two minutes; other leases follow a faster wave.
func demoDemand(leases []allocator.Lease, t time.Time) map[string]float64 {
	out := make(map[string]float64, len(leases))
	for _, l := range leases {
		if l.Owner.Labels["app"] == "tf-training" {
			out[l.ID] = 0.55 + 0.4*math.Sin(2*math.Pi*float64(t.UnixMilli()%120000)/120000)
		} else {
			out[l.ID] = 0.3 + 0.2*math.Sin(2*math.Pi*float64(t.UnixMilli()%45000)/45000)
		}
	}
	return out
}

// workload is the demo's tenants, a step a second: the training group
// holds its leases, and other tenants come and go, renewing what they
// hold as `gpupool run` does, each with its namespace's client. What it
// asks for and holds how long follows from the seed and the step count,
// never from the time, so that one seed makes one layout.
type workload struct {
	tenants map[string]*client.Client
	rng     *rand.Rand
	log     *slog.Logger
	steps   int
	held    []heldLease
}

// heldLease is a lease the workload holds until step until.
type heldLease struct {
	id, pod string
	c       *client.Client
	until   int
}

// forever is the hold of the training group's leases.
const forever = math.MaxInt

func newWorkload(tenants map[string]*client.Client, seed uint64, log *slog.Logger) *workload {
	return &workload{tenants: tenants, rng: rand.New(rand.NewPCG(seed, 99)), log: log}
}

// run takes a step every interval until ctx ends.
func (w *workload) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.step(ctx)
		}
	}
}

// step releases the leases whose time is up, renews the others, has the
// training group ask for what it lacks, and maybe starts a batch job and
// a notebook.
func (w *workload) step(ctx context.Context) {
	n := w.steps
	w.steps++
	kept := w.held[:0]
	for _, h := range w.held {
		if n >= h.until {
			_ = h.c.Release(ctx, h.id)
			continue
		}
		if _, err := h.c.Renew(ctx, h.id, 30*time.Second); err == nil {
			kept = append(kept, h)
		}
	}
	w.held = kept
	// The training group is a Deployment of three replicas: each holds a
	// lease, and a replica without one asks again.
	for i := range 3 {
		pod := fmt.Sprint("tf-training-", i)
		if !slices.ContainsFunc(w.held, func(h heldLease) bool { return h.pod == pod }) {
			w.acquire(ctx, api.AcquireRequest{Namespace: "ml", GPUAmount: 1, GPUPercent: 50, TTL: "30s",
				Owner: api.Owner{Pod: pod, UID: "uid-" + pod, Labels: map[string]string{"app": "tf-training"}}}, forever)
		}
	}
	if w.rng.IntN(2) == 0 {
		pod := fmt.Sprint("job-", n)
		r := api.AcquireRequest{Namespace: "team-b", GPUAmount: 1, TTL: "30s",
			Owner: api.Owner{Pod: pod, UID: "uid-" + pod, Labels: map[string]string{"app": "batch"}}}
		switch w.rng.IntN(3) {
		case 0:
			r.GPUPercent = 25
		case 1:
			r.GPUMemory = "8Gi"
		default:
			r.GPUAmount, r.GPUPercent = 2, 100
		}
		w.acquire(ctx, r, n+5+w.rng.IntN(20))
	}
	if w.rng.IntN(4) == 0 {
		pod := fmt.Sprint("notebook-", n)
		w.acquire(ctx, api.AcquireRequest{Namespace: "ml", GPUAmount: 1, GPUPercent: 10, TTL: "30s",
			Owner: api.Owner{Pod: pod, UID: "uid-" + pod, Labels: map[string]string{"app": "notebook"}}}, n+20)
	}
}

// acquire asks for r with its namespace's client and holds the lease until
// step until; a refusal (quota, no room) is logged.
func (w *workload) acquire(ctx context.Context, r api.AcquireRequest, until int) {
	c := w.tenants[r.Namespace]
	l, err := c.Acquire(ctx, r)
	if err != nil {
		w.log.Info("workload request refused", "namespace", r.Namespace, "pod", r.Owner.Pod, "err", err)
		return
	}
	w.held = append(w.held, heldLease{l.ID, r.Owner.Pod, c, until})
}

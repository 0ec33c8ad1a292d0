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

// runWorkload holds the training group's leases and lets other tenants
// come and go, renewing what it holds as `gpupool run` does, each with
// its namespace's client (tenants).
func runWorkload(ctx context.Context, tenants map[string]*client.Client, seed uint64, log *slog.Logger) {
	rng := rand.New(rand.NewPCG(seed, 99))
	type held struct {
		id, pod string
		c       *client.Client
		until   time.Time
	}
	var leases []held
	acquire := func(r api.AcquireRequest, hold time.Duration) {
		c := tenants[r.Namespace]
		l, err := c.Acquire(ctx, r)
		if err != nil {
			log.Info("workload request refused", "namespace", r.Namespace, "pod", r.Owner.Pod, "err", err)
			return
		}
		leases = append(leases, held{l.ID, r.Owner.Pod, c, time.Now().Add(hold)})
	}
	// The training group is a Deployment of three replicas: each holds a
	// lease, and a replica without one asks again.
	training := func() {
		for i := range 3 {
			pod := fmt.Sprint("tf-training-", i)
			if !slices.ContainsFunc(leases, func(h held) bool { return h.pod == pod }) {
				acquire(api.AcquireRequest{Namespace: "ml", GPUAmount: 1, GPUPercent: 50, TTL: "30s",
					Owner: allocator.Owner{Pod: pod, UID: "uid-" + pod, Labels: map[string]string{"app": "tf-training"}}}, 24*time.Hour)
			}
		}
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		kept := leases[:0]
		for _, h := range leases {
			if time.Now().After(h.until) {
				_ = h.c.Release(ctx, h.id)
				continue
			}
			if _, err := h.c.Renew(ctx, h.id, 30*time.Second); err == nil {
				kept = append(kept, h)
			}
		}
		leases = kept
		training()
		if rng.IntN(2) == 0 {
			pod := fmt.Sprint("job-", n)
			r := api.AcquireRequest{Namespace: "team-b", GPUAmount: 1, TTL: "30s",
				Owner: allocator.Owner{Pod: pod, UID: "uid-" + pod, Labels: map[string]string{"app": "batch"}}}
			switch rng.IntN(3) {
			case 0:
				r.GPUPercent = 25
			case 1:
				r.GPUMemory = "8Gi"
			default:
				r.GPUAmount, r.GPUPercent = 2, 100
			}
			acquire(r, time.Duration(5+rng.IntN(20))*time.Second)
		}
		if rng.IntN(4) == 0 {
			pod := fmt.Sprint("notebook-", n)
			acquire(api.AcquireRequest{Namespace: "ml", GPUAmount: 1, GPUPercent: 10, TTL: "30s",
				Owner: allocator.Owner{Pod: pod, UID: "uid-" + pod, Labels: map[string]string{"app": "notebook"}}}, 20*time.Second)
		}
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/allocator/service"
	"github.com/gpupool/gpupool/allocator/store"
)

// TestStatusTablesSayTheirUnits: every number the read-only commands print
// says its unit (a share in percent of one GPU, memory in GiB, a time
// left as a duration); only counts and indices stand bare.
func TestStatusTablesSayTheirUnits(t *testing.T) {
	url := startTestAllocator(t, map[string]allocator.Share{"ml": allocator.ShareGPUs(4)})
	ctx := context.Background()
	cl, err := client.New([]string{url}, "")
	if err != nil {
		t.Fatal(err)
	}
	srv := api.Server{Name: "gpu-a", GPUs: []api.GPU{{UUID: "GPU-a0", Model: "A100", MemoryBytes: 80 << 30, Healthy: true}}}
	if err := cl.RegisterServer(ctx, srv); err != nil {
		t.Fatal(err)
	}
	for _, r := range []api.AcquireRequest{
		{Namespace: "ml", GPUAmount: 1, GPUPercent: 50, TTL: "1h"},
		{Namespace: "ml", GPUAmount: 1, GPUMemory: "8000M", TTL: "1h"}, // 7.45Gi of 80Gi: 9.4%
		{Namespace: "ml", GPUAmount: 1, GPUPercent: 10, Owner: api.Owner{Pod: "serve-0", UID: "uid-0"}, UntilReleased: true},
	} {
		if _, err := cl.Acquire(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		args []string
		want []string // table rows, columns split on runs of spaces
	}{
		{[]string{"pool", "status"}, []string{
			"SERVER GPU MODEL MEMORY LEASED HEALTH SERVER STATE LEASES",
			"gpu-a 0 A100 80GiB 69.4% healthy schedulable 3",
		}},
		{[]string{"leases"}, []string{
			"LEASE NAMESPACE POD SERVER GPUS EXPIRES",
			"lease-000001 ml gpu-a 0:50% DURATION",
			"lease-000002 ml gpu-a 0:9.4% DURATION",
			"lease-000003 ml serve-0 gpu-a 0:10% until released",
		}},
		{[]string{"leases", "--owner-uid", "uid-0"}, []string{
			"LEASE NAMESPACE POD SERVER GPUS EXPIRES",
			"lease-000003 ml serve-0 gpu-a 0:10% until released",
		}},
		{[]string{"quota"}, []string{
			"NAMESPACE USED HARD",
			"ml 69.4% 400%",
		}},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(append(tc.args, "--allocator", url), &stdout, &stderr); code != 0 {
			t.Fatalf("gpupool %v: exit %d\n%s", tc.args, code, stderr.String())
		}
		got := strings.Split(strings.TrimSpace(stdout.String()), "\n")
		for i := range got {
			got[i] = strings.Join(strings.Fields(got[i]), " ")
			// The time left runs with the clock: "59m59s" or "1h0m0s".
			got[i] = regexp.MustCompile(`\b(\d+h)?(\d+m)?\d+s$`).ReplaceAllString(got[i], "DURATION")
		}
		if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
			t.Errorf("gpupool %v printed\n%s\nwant\n%s", tc.args, strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
		}
	}
}

// startTestAllocator serves an allocator without authentication on a
// bolt store in a temporary directory and returns its URL.
func startTestAllocator(t *testing.T, quotas map[string]allocator.Share) string {
	t.Helper()
	st, err := store.OpenBolt(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := service.New(context.Background(), service.Config{Store: st, Policy: "best-fit", DefaultTTL: time.Minute,
		MaxTTL: time.Hour, HeartbeatTimeout: time.Minute, Quotas: quotas, Registry: reg, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(service.Handler(svc, nil, reg, log))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestIdleLeases: `gpupool leases --idle` lists the leases the console's
// view shows measured idle, of the namespace and server asked, longest
// first, with the policy's verdict and deadline.
func TestIdleLeases(t *testing.T) {
	reclaim := time.Date(2026, 11, 29, 14, 5, 0, 0, time.UTC)
	secs := func(s float64) *float64 { return &s }
	view := api.Console{Leases: []api.ConsoleLease{
		{ID: "lease-000001", Namespace: "ml", Pod: "notebook-0", Server: "gpu-a", ShareGPUs: 1, Use: secs(0.01), IdleSeconds: secs(1800), Idle: true, ReclaimAt: &reclaim},
		{ID: "lease-000002", Namespace: "ml", Pod: "train-0", Server: "gpu-a", ShareGPUs: 0.5, Use: secs(0.9)},
		{ID: "lease-000003", Namespace: "ml", Pod: "train-1", Server: "gpu-b", ShareGPUs: 0.5, Use: secs(0.05), IdleSeconds: secs(2400)},
		{ID: "lease-000004", Namespace: "batch", Pod: "job-0", Server: "gpu-a", ShareGPUs: 2, IdleSeconds: secs(60)},
	}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _ = json.NewEncoder(w).Encode(view) }))
	defer srv.Close()
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"leases", "--idle"}, []string{
			"LEASE NAMESPACE POD SERVER SHARE USE IDLE WINDOW RECLAIMED",
			"lease-000003 ml train-1 gpu-b 0.50 GPUs 5% 40m0s not yet never (report)",
			"lease-000001 ml notebook-0 gpu-a 1.00 GPUs 1% 30m0s whole 2026-11-29T14:05:00Z",
			"lease-000004 batch job-0 gpu-a 2.00 GPUs unknown 1m0s not yet never (report)",
		}},
		{[]string{"leases", "--idle", "--namespace", "ml", "--server", "gpu-a"}, []string{
			"LEASE NAMESPACE POD SERVER SHARE USE IDLE WINDOW RECLAIMED",
			"lease-000001 ml notebook-0 gpu-a 1.00 GPUs 1% 30m0s whole 2026-11-29T14:05:00Z",
		}},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(append(tc.args, "--allocator", srv.URL), &stdout, &stderr); code != 0 {
			t.Fatalf("gpupool %v: exit %d\n%s", tc.args, code, stderr.String())
		}
		got := strings.Split(strings.TrimSpace(stdout.String()), "\n")
		for i := range got {
			got[i] = strings.Join(strings.Fields(got[i]), " ")
		}
		if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
			t.Errorf("gpupool %v printed\n%s\nwant\n%s", tc.args, strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
		}
	}
}

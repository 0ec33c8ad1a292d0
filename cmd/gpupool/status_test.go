package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
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

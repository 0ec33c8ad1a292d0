package leases

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
)

// TestWarnIdle: the pod of a lease measured idle for its whole window
// gets one Warning Event per run of idle samples, saying since when, under
// which bar and what the policy does; a lease short of its window, a
// lease with a TTL (no pod's) and a lease whose pod is gone get none; a
// new run warns again.
func TestWarnIdle(t *testing.T) {
	since := time.Date(2026, 11, 29, 13, 20, 0, 0, time.UTC)
	reclaim := since.Add(45 * time.Minute)
	idle := func(id, pod string, whole bool, from time.Time, reclaimAt time.Time) api.Lease {
		l := api.Lease{ID: id, Namespace: namespace, Server: "s1", UntilReleased: true, Owner: api.Owner{Pod: pod, UID: pod + "-uid"}}
		l.Idle = &api.LeaseIdle{Since: from, Seconds: 1800, UseBelow: 0.1, Window: api.Duration(30 * time.Minute), Whole: whole, Action: "report", ReclaimAt: reclaimAt}
		if !reclaimAt.IsZero() {
			l.Idle.Action = "reclaim"
		}
		return l
	}
	ttl := idle("lease-000004", "gpupool-run", true, since, time.Time{})
	ttl.UntilReleased = false
	var mu sync.Mutex
	leases := []api.Lease{
		idle("lease-000001", "notebook-0", true, since, reclaim),
		idle("lease-000002", "train-0", false, since, time.Time{}),
		idle("lease-000003", "serve-0", true, since, time.Time{}),
		ttl,
		idle("lease-000005", "deleted-0", true, since, time.Time{}),
	}
	alloc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/leases" || r.URL.Query().Get("idle") != "true" {
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		_ = json.NewEncoder(w).Encode(api.LeaseList{Leases: leases})
	}))
	defer alloc.Close()
	cl, err := client.New([]string{alloc.URL}, "")
	if err != nil {
		t.Fatal(err)
	}
	k := fake.NewClientset()
	events := record.NewFakeRecorder(100)
	c, err := NewController(Config{Client: k, Allocator: cl, Recorder: events})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"notebook-0", "train-0", "serve-0", "gpupool-run"} {
		if _, err := k.CoreV1().Pods(namespace).Create(t.Context(), gpuPod(name, "s1", 50), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.warnIdle(t.Context()); err != nil {
		t.Fatal(err)
	}
	wantOnly(t, events,
		"Warning IdleGPUs idle for 30m0s (use under 10% of its GPU share since 2026-11-29T13:20:00Z); its GPUs are reclaimed at 2026-11-29T14:05:00Z unless used",
		"Warning IdleGPUs idle for 30m0s (use under 10% of its GPU share since 2026-11-29T13:20:00Z); its namespace's idle policy reports it, and reclaims nothing")
	// The same runs: no Event again. notebook-0 used its GPU, then went
	// idle again: a new run, a new warning.
	if err := c.warnIdle(t.Context()); err != nil {
		t.Fatal(err)
	}
	wantOnly(t, events)
	mu.Lock()
	leases[0] = idle("lease-000001", "notebook-0", true, since.Add(time.Hour), reclaim.Add(time.Hour))
	mu.Unlock()
	if err := c.warnIdle(t.Context()); err != nil {
		t.Fatal(err)
	}
	wantOnly(t, events, "Warning IdleGPUs idle for 30m0s (use under 10% of its GPU share since 2026-11-29T14:20:00Z); its GPUs are reclaimed at 2026-11-29T15:05:00Z unless used")
}

// wantOnly checks that the Events recorded since the last call are want,
// in order.
func wantOnly(t *testing.T, events *record.FakeRecorder, want ...string) {
	t.Helper()
	var got []string
	for len(events.Events) > 0 {
		got = append(got, <-events.Events)
	}
	if len(got) != len(want) {
		t.Fatalf("Events %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("Event %d: %q, want %q", i, got[i], want[i])
		}
	}
}

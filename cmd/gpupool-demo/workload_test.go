package main

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/gpupool/gpupool/allocator/client"
)

// TestOneSeedOneLayout runs the demo twice on one seed, takes its
// workload through the same steps, and expects every lease placed alike:
// the servers register in one order and the workload counts steps, not
// time.
func TestOneSeedOneLayout(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir()) // where the demo keeps its log
	const seed, steps = 7, 40
	layout := func() []string {
		d, err := startDemo(context.Background(), seed)
		if err != nil {
			t.Fatal(err)
		}
		defer d.close()
		ctx := context.Background()
		w := newWorkload(d.tenants, seed, d.log)
		for range steps {
			w.step(ctx)
		}
		leases, err := d.client.Leases(ctx, client.LeaseFilter{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range leases {
			out = append(out, fmt.Sprintf("%s %s/%s on %s %+v", l.ID, l.Namespace, l.Owner.Pod, l.Server, l.GPUs))
		}
		slices.Sort(out)
		return out
	}
	first, second := layout(), layout()
	if len(first) == 0 {
		t.Fatal("the workload holds no lease")
	}
	if !slices.Equal(first, second) {
		t.Errorf("seed %d placed the leases differently:\n%q\nthen\n%q", seed, first, second)
	}
}

package allocator

import "testing"

func TestWorkloadEstimateRebuildsOftenWhileYoung(t *testing.T) {
	var e WorkloadEstimate
	if e.Current() != nil {
		t.Fatalf("an estimate of no grants is %v, want none", e.Current())
	}
	var rebuilt []int
	for n := 1; n <= 3*EstimateWindow; n++ {
		if e.Add(Demand{GPUs: 1, PerGPU: 500, CPUMilli: 4000}) {
			rebuilt = append(rebuilt, n)
		}
	}
	want := []int{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 3072, 4096, 5120, 6144, 7168, 8192, 9216, 10240, 11264, 12288}
	if len(rebuilt) != len(want) {
		t.Fatalf("rebuilt after grants %v, want %v", rebuilt, want)
	}
	for i := range want {
		if rebuilt[i] != want[i] {
			t.Fatalf("rebuilt after grants %v, want %v", rebuilt, want)
		}
	}
}

func TestWorkloadEstimateForgetsBeyondItsWindow(t *testing.T) {
	var e WorkloadEstimate
	old, recent := Demand{GPUs: 8, PerGPU: WholeGPU, CPUMilli: 64000}, Demand{GPUs: 1, PerGPU: 250, CPUMilli: 2000}
	for range EstimateWindow {
		e.Add(old)
	}
	if w := e.Current(); len(w) != 1 || w[0].GPUs != 8 {
		t.Fatalf("after a window of 8-GPU grants the workload is %+v", w)
	}
	before := e.Current()
	for range EstimateWindow {
		e.Add(recent)
	}
	w := e.Current()
	if len(w) != 1 || w[0].GPUs != 1 || w[0].PerGPU != 250 || w[0].CPUMilli != 2000 || w[0].Weight != 1 {
		t.Errorf("a window later the workload is %+v, want only the quarter-GPU task", w)
	}
	if len(before) != 1 || before[0].GPUs != 8 {
		t.Errorf("an earlier Current changed under its reader: %+v", before)
	}
}

func TestWorkloadEstimateSeededFromLeases(t *testing.T) {
	var e WorkloadEstimate
	if e.Seed(nil) || e.Current() != nil {
		t.Fatal("seeding with no leases built a workload")
	}
	half := Lease{GPUs: []LeaseGPU{{Share: 500}}, CPUMilli: 4000}
	pair := Lease{GPUs: []LeaseGPU{{Share: WholeGPU}, {Share: WholeGPU}}, CPUMilli: 16000}
	if !e.Seed([]Demand{GrantedShape(&half), GrantedShape(&half), GrantedShape(&half), GrantedShape(&pair)}) {
		t.Fatal("seeding with leases did not rebuild")
	}
	w := e.Current()
	if len(w) != 2 || w[0].GPUs != 1 || w[0].PerGPU != 500 || w[0].Weight != 0.75 || w[1].GPUs != 2 || w[1].PerGPU != WholeGPU {
		t.Errorf("seeded workload %+v, want three halves to one pair", w)
	}
}

package simulate

import (
	"bytes"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/inventory"
)

func pct(p float64) *float64 { return &p }

func derive(t *testing.T, tr *Trace, v Variant, seed uint64) []Pod {
	t.Helper()
	pods, err := v.Derive(tr.Pods, tr.Servers, seed)
	if err != nil {
		t.Fatalf("%s: %v", v, err)
	}
	return pods
}

// gpuPodsWith counts the GPU pods for which has holds, and all GPU pods.
func gpuPodsWith(pods []Pod, has func(*Pod) bool) (n, of int) {
	for i := range pods {
		if pods[i].GPUs > 0 {
			of++
			if has(&pods[i]) {
				n++
			}
		}
	}
	return n, of
}

func namesModels(p *Pod) bool { return len(p.Models) > 0 }

func inClass(c podClass) func(*Pod) bool { return func(p *Pod) bool { return classOf(p) == c } }

// TestVariantHitsItsShares: each share is met to the pod, on the default
// list (no constraints, 3078 fractional and 75 multi-GPU of 7064 GPU pods)
// and on gpuspec10 (732 constrained), up and down.
func TestVariantHitsItsShares(t *testing.T) {
	for _, pods := range []string{DefaultPods, GPUSpec10Pods} {
		tr := loadTrace(t, pods)
		for _, tc := range []struct {
			v   Variant
			has func(*Pod) bool
			pct float64
		}{
			{Variant{ModelsPct: pct(25)}, namesModels, 25},
			{Variant{ModelsPct: pct(0)}, namesModels, 0},
			{Variant{ModelsPct: pct(100)}, namesModels, 100},
			{Variant{FractionalPct: pct(20)}, inClass(fractional), 20},
			{Variant{FractionalPct: pct(80)}, inClass(fractional), 80},
			{Variant{MultiGPUPct: pct(3.5)}, inClass(multiGPU), 3.5},
			{Variant{MultiGPUPct: pct(40)}, inClass(multiGPU), 40},
			{Variant{MultiGPUPct: pct(0)}, inClass(multiGPU), 0},
			{Variant{FractionalPct: pct(10), MultiGPUPct: pct(90)}, inClass(multiGPU), 90},
			{Variant{FractionalPct: pct(10), MultiGPUPct: pct(90)}, inClass(fractional), 10},
		} {
			got, of := gpuPodsWith(derive(t, tr, tc.v, 1), tc.has)
			if want := int(math.Round(tc.pct * float64(of) / 100)); got != want {
				t.Errorf("%s on %s: %d of %d GPU pods, want %d", tc.v, pods, got, of, want)
			}
		}
	}
	// The reference point: a quarter of the default list's GPU pods.
	if got, of := gpuPodsWith(derive(t, loadTrace(t, DefaultPods), Variant{ModelsPct: pct(25)}, 7), namesModels); got != 1766 || of != 7064 {
		t.Errorf("models=25%% on the default list: %d of %d GPU pods name models, want 1766 of 7064", got, of)
	}
}

// withinSampling fails when a share drawn n times is further than four
// standard errors from the share p it was drawn with.
func withinSampling(t *testing.T, what string, got float64, p float64, n int) {
	t.Helper()
	if tol := 4 * math.Sqrt(p*(1-p)/float64(n)); math.Abs(got-p) > tol {
		t.Errorf("%s: %.4f drawn %d times, want %.4f ± %.4f", what, got, n, p, tol)
	}
}

// TestVariantDrawsConstraintsFromTheMix: pods every server can hold draw
// each gpu_spec as often as gpuspec10 names it.
func TestVariantDrawsConstraintsFromTheMix(t *testing.T) {
	tr := loadTrace(t, DefaultPods)
	mix, err := modelMix(tr.Servers)
	if err != nil {
		t.Fatal(err)
	}
	smallest := host{gpus: math.MaxInt, cpuMilli: math.MaxInt64, memory: math.MaxInt64}
	for _, s := range tr.Servers {
		smallest = host{min(smallest.gpus, len(s.GPUs)), min(smallest.cpuMilli, s.CPUMilli), min(smallest.memory, s.MemoryBytes)}
	}
	drawn := map[string]int{}
	n := 0
	for _, p := range derive(t, tr, Variant{ModelsPct: pct(50)}, 1) {
		if len(p.Models) > 0 && smallest.holds(&p) {
			drawn[strings.Join(p.Models, "|")]++
			n++
		}
	}
	total := 0
	for _, s := range mix {
		total += s.pods
	}
	for _, s := range mix {
		text := strings.Join(s.models, "|")
		withinSampling(t, "share of "+text, float64(drawn[text])/float64(n), float64(s.pods)/float64(total), n)
	}
}

// TestVariantDrawsShapesFromTheList: pods made fractional take the asks
// of the list's fractional pods, and multi-GPU ones its multi-GPU sizes.
func TestVariantDrawsShapesFromTheList(t *testing.T) {
	tr := loadTrace(t, DefaultPods)
	for _, tc := range []struct {
		v     Variant
		class podClass
		ask   func(*Pod) float64
	}{
		{Variant{FractionalPct: pct(80)}, fractional, func(p *Pod) float64 { return float64(p.PerGPU) }},
		{Variant{MultiGPUPct: pct(40)}, multiGPU, func(p *Pod) float64 { return float64(p.GPUs) }},
	} {
		var donors []float64
		for i := range tr.Pods {
			if tr.Pods[i].GPUs > 0 && classOf(&tr.Pods[i]) == tc.class {
				donors = append(donors, tc.ask(&tr.Pods[i]))
			}
		}
		var moved []float64
		for i, p := range derive(t, tr, tc.v, 1) {
			if classOf(&p) == tc.class && p.GPUs > 0 && classOf(&tr.Pods[i]) != tc.class {
				moved = append(moved, tc.ask(&p))
			}
		}
		mean, sd := meanSD(donors)
		got, _ := meanSD(moved)
		if tol := 4 * sd / math.Sqrt(float64(len(moved))); math.Abs(got-mean) > tol {
			t.Errorf("%s: moved pods ask %.1f on average, the list's %.1f ± %.1f", tc.v, got, mean, tol)
		}
	}
}

func meanSD(xs []float64) (mean, sd float64) {
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	for _, x := range xs {
		sd += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(sd / float64(len(xs)))
}

// TestVariantFallsBackToEmbeddedShapes: a list with too few multi-GPU pods
// takes the sizes of multigpu20's.
func TestVariantFallsBackToEmbeddedShapes(t *testing.T) {
	tr := &Trace{Servers: loadTrace(t, DefaultPods).Servers}
	for i := range 100 {
		tr.Pods = append(tr.Pods, Pod{Name: fmt.Sprintf("p%d", i), CPUMilli: 4000, GPUs: 1, PerGPU: allocator.WholeGPU})
	}
	got, of := gpuPodsWith(derive(t, tr, Variant{MultiGPUPct: pct(50)}, 1), inClass(multiGPU))
	if got != 50 || of != 100 {
		t.Errorf("multi-gpu=50%%: %d of %d multi-GPU", got, of)
	}
	for _, p := range derive(t, tr, Variant{MultiGPUPct: pct(50)}, 1) {
		if p.GPUs > 1 && !slices.Contains([]int{2, 4, 8}, p.GPUs) {
			t.Errorf("pod %s asks %d GPUs; multigpu20 asks 2, 4 or 8", p.Name, p.GPUs)
		}
	}
}

// TestVariantLeavesUnsetFieldsAlone: each field changes only what it sets.
func TestVariantLeavesUnsetFieldsAlone(t *testing.T) {
	tr := loadTrace(t, GPUSpec10Pods)
	if got := derive(t, tr, Variant{}, 1); !reflect.DeepEqual(got, tr.Pods) {
		t.Error("the empty variant changed the pods")
	}
	shape := func(p Pod) Pod { p.Models = nil; return p }
	for i, p := range derive(t, tr, Variant{ModelsPct: pct(40)}, 1) {
		if !reflect.DeepEqual(shape(p), shape(tr.Pods[i])) {
			t.Fatalf("models=40%% changed pod %s's shape: %+v, was %+v", p.Name, p, tr.Pods[i])
		}
	}
	for _, v := range []Variant{{FractionalPct: pct(70)}, {MultiGPUPct: pct(10)}} {
		for i, p := range derive(t, tr, v, 1) {
			if !slices.Equal(p.Models, tr.Pods[i].Models) || p.Name != tr.Pods[i].Name {
				t.Fatalf("%s changed pod %s's name or models", v, tr.Pods[i].Name)
			}
		}
	}
	fracBefore, _ := gpuPodsWith(tr.Pods, inClass(fractional))
	if got, _ := gpuPodsWith(derive(t, tr, Variant{MultiGPUPct: pct(10)}, 1), inClass(fractional)); got != fracBefore {
		t.Errorf("multi-gpu=10%% changed the fractional pods from %d to %d", fracBefore, got)
	}
	for i, p := range derive(t, tr, Variant{CPUFactor: 0.5}, 1) {
		want := tr.Pods[i]
		if want.GPUs > 0 {
			want.CPUMilli = int64(math.Round(float64(want.CPUMilli) / 2))
		}
		if !reflect.DeepEqual(p, want) {
			t.Fatalf("cpu=x0.5: pod %+v, want %+v", p, want)
		}
	}
}

func TestVariantIsDeterministicPerSeed(t *testing.T) {
	tr := loadTrace(t, DefaultPods)
	v := Variant{ModelsPct: pct(25), FractionalPct: pct(60), MultiGPUPct: pct(3.5), CPUFactor: 0.5}
	a, b, c := derive(t, tr, v, 3), derive(t, tr, v, 3), derive(t, tr, v, 4)
	if !reflect.DeepEqual(a, b) {
		t.Error("seed 3 derived two different lists")
	}
	if reflect.DeepEqual(a, c) {
		t.Error("seeds 3 and 4 derived the same list: is the seed used?")
	}
}

func TestVariantRefusesWhatItCannotDerive(t *testing.T) {
	tr := loadTrace(t, DefaultPods) // 43.6% of its GPU pods are fractional
	if _, err := (Variant{MultiGPUPct: pct(60)}).Derive(tr.Pods, tr.Servers, 1); err == nil ||
		!strings.Contains(err.Error(), "3078 fractional and 4238 multi-GPU pods of 7064 GPU pods") {
		t.Errorf("multi-gpu=60%% on the default list: %v", err)
	}
	noSpecModel := []inventory.Server{{Name: "h", CPUMilli: 64000, MemoryBytes: 1 << 40, GPUs: []inventory.GPU{{Model: "H100", Healthy: true}}}}
	if _, err := (Variant{ModelsPct: pct(10)}).Derive(tr.Pods, noSpecModel, 1); err == nil ||
		!strings.Contains(err.Error(), "no gpu_spec of "+GPUSpec10Pods+" can be satisfied") {
		t.Errorf("models=10%% on H100 servers only: %v", err)
	}
}

func TestParseVariant(t *testing.T) {
	for _, s := range []string{"models=25%,fractional=60%,multi-gpu=3.5%,cpu=x0.5", "models=0%", "cpu=x2"} {
		v, err := ParseVariant(s)
		if err != nil || v.String() != s {
			t.Errorf("ParseVariant(%q) = %s, %v", s, v, err)
		}
	}
	for _, s := range []string{"", "as is"} {
		if v, err := ParseVariant(s); err != nil || v.String() != "as is" || !reflect.DeepEqual(v, Variant{}) {
			t.Errorf("ParseVariant(%q) = %+v, %v", s, v, err)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"models=125%", "models 125% out of range 0%..100%"},
		{"models=-1%", "models -1% out of range 0%..100%"},
		{"fractional=60", "fractional 60 is not a percentage such as 25%"},
		{"multi-gpu=lots", "multi-gpu lots is not a percentage such as 25%"},
		{"cpu=0.5", "cpu 0.5 is not a factor such as x0.5"},
		{"cpu=x0", "cpu x0 out of range above x0..x16"},
		{"cpu=x17", "cpu x17 out of range above x0..x16"},
		{"gpus=5%", `"gpus" is not a field: the fields are models, fractional, multi-gpu, cpu`},
		{"models=5%,models=6%", "models is given twice"},
		{"fractional=80%,multi-gpu=40%", "fractional+multi-gpu 120% is more than 100% of the GPU pods"},
	} {
		if _, err := ParseVariant(tc.in); err == nil || err.Error() != tc.want {
			t.Errorf("ParseVariant(%q) = %v, want %q", tc.in, err, tc.want)
		}
	}
}

func TestWritePodsReadsBack(t *testing.T) {
	tr := loadTrace(t, GPUSpec10Pods)
	var b bytes.Buffer
	if err := WritePods(&b, tr.Pods); err != nil {
		t.Fatal(err)
	}
	got, err := ReadPods(&b)
	if err != nil || !reflect.DeepEqual(got, tr.Pods) {
		t.Errorf("read back %d pods, %v; want the %d written", len(got), err, len(tr.Pods))
	}
}

package admission

import (
	"slices"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/gpupool/gpupool/kube"
)

// TestWarnings: a bare bitfusion.io/gpu that probably means the other unit
// is admitted with a warning that says what it means here and how to ask
// for the other; BFK's forms, and numbers that read the same either way,
// get none.
func TestWarnings(t *testing.T) {
	for _, tc := range []struct {
		unit   kube.Unit
		limits []string
		want   string
	}{
		{kube.UnitPercent, []string{"bitfusion.io/gpu=2"}, "spec.containers[0].resources.limits[bitfusion.io/gpu]: 2 is 2% of one GPU: this cluster counts bitfusion.io/gpu in percent (100 is one GPU); for 2 whole GPUs ask 200, or bitfusion.io/gpu-amount: 2"},
		{kube.UnitPercent, []string{"bitfusion.io/gpu=8"}, "spec.containers[0].resources.limits[bitfusion.io/gpu]: 8 is 8% of one GPU: this cluster counts bitfusion.io/gpu in percent (100 is one GPU); for 8 whole GPUs ask 800, or bitfusion.io/gpu-amount: 8"},
		{kube.UnitPercent, []string{"bitfusion.io/gpu=50"}, ""},
		{kube.UnitPercent, []string{"bitfusion.io/gpu-amount=2"}, ""},
		{kube.UnitPercent, []string{"bitfusion.io/gpu-amount=1", "bitfusion.io/gpu-percent=5"}, ""},
		{kube.UnitGPUs, []string{"bitfusion.io/gpu=50"}, "spec.containers[0].resources.limits[bitfusion.io/gpu]: 50 is 50 whole GPUs on one server: this cluster counts bitfusion.io/gpu in whole GPUs; for 50% of one GPU ask bitfusion.io/gpu-amount: 1 and bitfusion.io/gpu-percent: 50"},
		{kube.UnitGPUs, []string{"bitfusion.io/gpu=2"}, ""},
		// Slices of 8Gi of the cluster's 16000 MB GPUs: one fits, two do not.
		{kube.MemoryUnit(8 << 30), []string{"bitfusion.io/gpu=1"}, ""},
		{kube.MemoryUnit(8 << 30), []string{"bitfusion.io/gpu=50"}, "spec.containers[0].resources.limits[bitfusion.io/gpu]: 50 is 400Gi of one GPU's memory, more than this cluster's GPUs have (16G): this cluster counts bitfusion.io/gpu in slices of 8Gi; for whole GPUs ask bitfusion.io/gpu-amount"},
	} {
		got := config(tc.unit).Warnings(podOf(asking(tc.limits...)))
		var want []string
		if tc.want != "" {
			want = []string{tc.want}
		}
		if !slices.Equal(got, want) {
			t.Errorf("unit %s, %v: warnings %q, want %q", tc.unit, tc.limits, got, want)
		}
	}
}

// TestHandlerWarns: the warning reaches kube-apiserver in the review's
// answer, which passes it to the client (kubectl prints it).
func TestHandlerWarns(t *testing.T) {
	resp := answered(t, serve(t)+"/mutate", review(t, admissionv1.Create, podOf(asking("bitfusion.io/gpu=2")), nil))
	if !resp.Allowed || len(resp.Warnings) != 1 {
		t.Fatalf("response %+v: want allowed with one warning", resp)
	}
}

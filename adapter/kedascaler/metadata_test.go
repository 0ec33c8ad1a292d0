package kedascaler

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gpupool/gpupool/adapter/externalscaler"
	"github.com/gpupool/gpupool/internal/fielderr"
)

// tfTraining is tf-training's trigger metadata with changes: a value ""
// deletes the key.
func tfTraining(changes map[string]string) *externalscaler.ScaledObjectRef {
	md := map[string]string{"metric": "bitfusion_gpu_utilization", "selector": "app=tf-training", "target": "0.7",
		"scalerAddress": "gpupool-adapter.gpupool.svc:9471"}
	for k, v := range changes {
		if v == "" {
			delete(md, k)
		} else {
			md[k] = v
		}
	}
	return &externalscaler.ScaledObjectRef{Name: "tf-training", Namespace: "ml", ScalerMetadata: md}
}

// TestParseTrigger: a trigger's metadata is its metric, selector and
// target in the ScaledObject's namespace; KEDA's own keys pass.
func TestParseTrigger(t *testing.T) {
	for _, tc := range []struct {
		ref  *externalscaler.ScaledObjectRef
		want string
	}{
		{tfTraining(nil), "bitfusion_gpu_utilization ml app=tf-training 0.7"},
		{tfTraining(map[string]string{"namespace": "ml", "enableTLS": "true", "unsafeSsl": "false"}), "bitfusion_gpu_utilization ml app=tf-training 0.7"},
		{tfTraining(map[string]string{"metric": "bitfusion_idle_held_share", "selector": "", "target": "1e-3"}), "bitfusion_idle_held_share ml  0.001"},
		{tfTraining(map[string]string{"metric": "bitfusion_memory_pressure", "selector": "app in (a,b),!canary", "target": "1.2"}),
			"bitfusion_memory_pressure ml app in (a,b),!canary 1.2"},
	} {
		got, err := ParseTrigger(tc.ref)
		if err != nil {
			t.Errorf("%v: %v", tc.ref.ScalerMetadata, err)
			continue
		}
		if s := fmt.Sprintf("%s %s %s %v", got.Metric, got.Namespace, got.Selector, got.Target); s != tc.want {
			t.Errorf("%v: %s, want %s", tc.ref.ScalerMetadata, s, tc.want)
		}
	}
}

// badTriggers are metadata the scaler refuses, with what it says: the
// field, the value and the limit.
var badTriggers = []struct {
	name string
	ref  *externalscaler.ScaledObjectRef
	want string
}{
	{"unknown metric", tfTraining(map[string]string{"metric": "bitfusion_gpu_util"}),
		`scalerMetadata.metric "bitfusion_gpu_util" is not one of bitfusion_gpu_utilization, bitfusion_memory_pressure, bitfusion_idle_held_share`},
	{"no metric", tfTraining(map[string]string{"metric": ""}),
		`scalerMetadata.metric "" is not one of bitfusion_gpu_utilization, bitfusion_memory_pressure, bitfusion_idle_held_share`},
	{"a metric of several values", tfTraining(map[string]string{"metric": "bitfusion_rdma_latency_seconds"}),
		`scalerMetadata.metric "bitfusion_rdma_latency_seconds" is not one of`},
	{"malformed selector", tfTraining(map[string]string{"selector": "app in (a"}),
		`scalerMetadata.selector "app in (a" is not a label selector (`},
	{"selector of a bad label value", tfTraining(map[string]string{"selector": "app=tf training"}),
		`scalerMetadata.selector "app=tf training" is not a label selector (`},
	{"missing target", tfTraining(map[string]string{"target": ""}),
		`scalerMetadata.target "" is missing: the value per replica to scale to, above 0 (0.7)`},
	{"target not a number", tfTraining(map[string]string{"target": "70%"}), `scalerMetadata.target "70%" is not a number above 0 (0.7)`},
	{"target 0", tfTraining(map[string]string{"target": "0"}), `scalerMetadata.target "0" is not a number above 0 (0.7)`},
	{"target below 0", tfTraining(map[string]string{"target": "-0.5"}), `scalerMetadata.target "-0.5" is not a number above 0 (0.7)`},
	{"target NaN", tfTraining(map[string]string{"target": "NaN"}), `scalerMetadata.target "NaN" is not a number above 0 (0.7)`},
	{"target infinite", tfTraining(map[string]string{"target": "+Inf"}), `scalerMetadata.target "+Inf" is not a number above 0 (0.7)`},
	{"another namespace", tfTraining(map[string]string{"namespace": "team-b"}),
		`scalerMetadata.namespace "team-b" is not the ScaledObject's namespace "ml": a ScaledObject reads its own namespace's leases`},
	{"no namespace", &externalscaler.ScaledObjectRef{ScalerMetadata: map[string]string{"metric": "bitfusion_gpu_utilization", "target": "1"}},
		`namespace "" must name the ScaledObject's namespace`},
	{"unknown key", tfTraining(map[string]string{"targetValue": "0.7"}),
		`scalerMetadata key "targetValue" is unknown: the keys are metric, selector, namespace, target (and KEDA's scalerAddress, enableTLS, unsafeSsl)`},
	{"a key KEDA resolves from the environment", tfTraining(map[string]string{"targetFromEnv": "0.7"}), `scalerMetadata key "targetFromEnv" is unknown`},
	{"too many keys", tfTraining(manyKeys(17)), `scalerMetadata of 21 keys has more than 16`},
	{"too many bytes", tfTraining(map[string]string{"selector": "app in (" + strings.Repeat("a,", 2100) + "a)"}),
		`scalerMetadata of 4303 bytes is over 4096, keys and values together`},
	{"a long value is cut", tfTraining(map[string]string{"metric": strings.Repeat("x", 100)}),
		`scalerMetadata.metric "` + strings.Repeat("x", 40) + `..." is not one of`},
}

func manyKeys(n int) map[string]string {
	md := map[string]string{}
	for i := range n {
		md[fmt.Sprintf("k%02d", i)] = "v"
	}
	return md
}

// TestParseTriggerRefusesBadInput: each bad trigger is a field error
// naming the field, the value and the limit.
func TestParseTriggerRefusesBadInput(t *testing.T) {
	for _, tc := range badTriggers {
		_, err := ParseTrigger(tc.ref)
		var field *fielderr.Error
		if !errors.As(err, &field) || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a field error %q", tc.name, err, tc.want)
		}
	}
}

// FuzzParseTrigger: whatever the metadata, ParseTrigger neither panics
// nor accepts what breaks its bounds, and what it accepts asks a metric
// it serves with a target above 0 in the ScaledObject's namespace.
func FuzzParseTrigger(f *testing.F) {
	f.Add("bitfusion_gpu_utilization", "app=tf-training", "0.7", "ml", "scalerAddress", "x:1")
	f.Add("bitfusion_idle_held_share", "", "1", "ml", "namespace", "ml")
	f.Add("bitfusion_memory_pressure", "a in (b,c),!d,e!=f", "1e308", "", "unsafeSsl", "true")
	f.Add("bitfusion_gpu_utilization", "app==", "NaN", "ml", "targetFromEnv", "0.7")
	f.Fuzz(func(t *testing.T, metric, selector, target, namespace, key, value string) {
		ref := &externalscaler.ScaledObjectRef{Namespace: namespace,
			ScalerMetadata: map[string]string{"metric": metric, "selector": selector, "target": target, key: value}}
		trig, err := ParseTrigger(ref)
		if err != nil {
			var field *fielderr.Error
			if !errors.As(err, &field) {
				t.Fatalf("%v: not a field error", err)
			}
			return
		}
		size := 0
		for k, v := range ref.ScalerMetadata {
			size += len(k) + len(v)
		}
		if size > maxMetadataBytes || !(trig.Target > 0) || trig.Namespace != namespace || namespace == "" || trig.Selector == nil {
			t.Fatalf("accepted %v as %+v", ref.ScalerMetadata, trig)
		}
		found := false
		for _, m := range MetricNames {
			found = found || m == trig.Metric
		}
		if !found {
			t.Fatalf("accepted metric %q", trig.Metric)
		}
	})
}

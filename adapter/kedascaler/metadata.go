package kedascaler

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/gpupool/gpupool/adapter"
	"github.com/gpupool/gpupool/adapter/externalscaler"
	"github.com/gpupool/gpupool/internal/fielderr"
)

// MetricNames are the metrics a trigger may name: those that are one value
// for a workload. bitfusion_rdma_latency_seconds (one per transport) and
// the pool's and the queue's are the external metrics API's alone.
var MetricNames = []string{adapter.GPUUtilization, adapter.MemoryPressure, adapter.IdleHeldShare}

// The metadata keys of a trigger: the scaler's own, and KEDA's, which KEDA
// sends along with the others (they configure its connection).
var (
	ownKeys  = []string{"metric", "selector", "namespace", "target"}
	kedaKeys = []string{"scalerAddress", "enableTLS", "unsafeSsl"}
)

// The bounds of a trigger's metadata: KEDA sends it whole with every call,
// and a ScaledObject's author writes it. Seven keys are known; a selector
// of a few labels is a hundred bytes.
const (
	maxMetadataKeys  = 16
	maxMetadataBytes = 4096
)

// Trigger is what a ScaledObject's trigger asks: a metric of the leases
// of the pods its selector selects in its namespace, and the target the
// HPA scales it to.
type Trigger struct {
	Metric    string
	Namespace string
	Selector  labels.Selector
	Target    float64
}

// Query is the backend's query for the trigger's metric.
func (t Trigger) Query() adapter.Query {
	return t.query(t.Metric)
}

func (t Trigger) query(metric string) adapter.Query {
	return adapter.Query{Metric: metric, Namespace: t.Namespace, Selector: t.Selector}
}

// key tells triggers that ask the same apart: the streams of those that
// do share one poll.
func (t Trigger) key() string {
	return t.Namespace + "\x00" + t.Selector.String()
}

// ParseTrigger reads ref's metadata:
//
//	metric     bitfusion_gpu_utilization, bitfusion_memory_pressure or bitfusion_idle_held_share
//	selector   a label selector of the workload's pods (app=tf-training); empty selects every pod
//	namespace  the ScaledObject's (the default); no other
//	target     the value per replica the HPA scales to, above 0 (0.7)
//
// and KEDA's own keys, which it ignores. Anything else, or more than the
// bounds, is a *fielderr.Error naming the field, the value and the limit.
func ParseTrigger(ref *externalscaler.ScaledObjectRef) (Trigger, error) {
	md := ref.GetScalerMetadata()
	if len(md) > maxMetadataKeys {
		return Trigger{}, &fielderr.Error{Field: "scalerMetadata", Value: fmt.Sprintf("of %d keys", len(md)),
			Limit: fmt.Sprintf("has more than %d", maxMetadataKeys)}
	}
	size := 0
	for k, v := range md {
		size += len(k) + len(v)
	}
	if size > maxMetadataBytes {
		return Trigger{}, &fielderr.Error{Field: "scalerMetadata", Value: fmt.Sprintf("of %d bytes", size),
			Limit: fmt.Sprintf("is over %d, keys and values together", maxMetadataBytes)}
	}
	// In sorted order, so that the error for two unknown keys is always
	// the same.
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !slices.Contains(ownKeys, k) && !slices.Contains(kedaKeys, k) {
			return Trigger{}, &fielderr.Error{Field: "scalerMetadata", Value: "key " + strconv.Quote(fielderr.Shorten(k)),
				Limit: "is unknown: the keys are " + strings.Join(ownKeys, ", ") + " (and KEDA's " + strings.Join(kedaKeys, ", ") + ")"}
		}
	}

	t := Trigger{Metric: md["metric"], Namespace: ref.GetNamespace()}
	if !slices.Contains(MetricNames, t.Metric) {
		return Trigger{}, &fielderr.Error{Field: "scalerMetadata.metric", Value: strconv.Quote(fielderr.Shorten(t.Metric)),
			Limit: "is not one of " + strings.Join(MetricNames, ", ")}
	}
	if ns, ok := md["namespace"]; ok && ns != t.Namespace {
		return Trigger{}, &fielderr.Error{Field: "scalerMetadata.namespace", Value: strconv.Quote(fielderr.Shorten(ns)),
			Limit: fmt.Sprintf("is not the ScaledObject's namespace %q: a ScaledObject reads its own namespace's leases, as an HPA reads its own namespace's external metrics", t.Namespace)}
	}
	if t.Namespace == "" {
		return Trigger{}, &fielderr.Error{Field: "namespace", Value: "", Limit: "must name the ScaledObject's namespace"}
	}
	var err error
	if t.Selector, err = labels.Parse(md["selector"]); err != nil {
		return Trigger{}, &fielderr.Error{Field: "scalerMetadata.selector", Value: strconv.Quote(fielderr.Shorten(md["selector"])),
			Limit: "is not a label selector (" + err.Error() + ")"}
	}
	target, ok := md["target"]
	if !ok {
		return Trigger{}, &fielderr.Error{Field: "scalerMetadata.target", Value: "", Limit: "is missing: the value per replica to scale to, above 0 (0.7)"}
	}
	if t.Target, err = strconv.ParseFloat(target, 64); err != nil || !(t.Target > 0) || math.IsInf(t.Target, 1) {
		return Trigger{}, &fielderr.Error{Field: "scalerMetadata.target", Value: strconv.Quote(fielderr.Shorten(target)),
			Limit: "is not a number above 0 (0.7)"}
	}
	return t, nil
}

package adapter

import (
	"slices"
	"strings"

	"github.com/gpupool/gpupool/gpuserver/api"
)

// bucketQuantile estimates the q-quantile from cumulative buckets and the
// total count as PromQL's histogram_quantile does: linear interpolation in
// the bucket the rank falls in (from 0 in the first), and the highest
// finite bound when the rank falls beyond it.
func bucketQuantile(q float64, buckets []api.Bucket, total uint64) float64 {
	rank := q * float64(total)
	lower, below := 0.0, 0.0
	for _, b := range buckets {
		if float64(b.Count) >= rank {
			in := float64(b.Count) - below
			if in == 0 {
				return b.UpperBound
			}
			return lower + (b.UpperBound-lower)*(rank-below)/in
		}
		lower, below = b.UpperBound, float64(b.Count)
	}
	return lower
}

// joinLabels writes labels as sorted k=v pairs, comma-separated.
func joinLabels(l map[string]string) string {
	pairs := make([]string, 0, len(l))
	for k, v := range l {
		pairs = append(pairs, k+"="+v)
	}
	slices.Sort(pairs)
	return strings.Join(pairs, ",")
}

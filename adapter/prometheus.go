package adapter

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/yaml"

	"github.com/gpupool/gpupool/gpuserver/api"
)

//go:embed prometheus.yaml
var defaultQueries []byte

// Prometheus is the backend that asks Prometheus (or anything speaking its
// HTTP query API: VictoriaMetrics, Thanos) with a PromQL template per
// metric.
//
// A series whose target stopped answering goes stale at the next failed
// scrape, and then the query has no data. But Prometheus answers an instant
// query from the last sample in its lookback delta (5 minutes) stamped with
// the evaluation time, and some samples get no staleness marker: after
// Prometheus itself restarts, the last samples of a target that is down
// stay for the whole lookback delta, those of one that is up until its
// first scrape. So a value is dated by a second template per metric
// (sampledAt) that gives when the oldest sample behind it was taken, by
// timestamp() of the series the query reads; without one it is dated at
// evaluation.
type Prometheus struct {
	url       string
	api       promv1.API
	queries   map[string]*template.Template
	sampledAt map[string]*template.Template
}

// queryTimeout bounds a query: Prometheus gives up evaluating it, and the
// adapter waiting for the answer, after it.
const queryTimeout = 10 * time.Second

// NewPrometheus queries the server at baseURL with the templates in
// queriesFile (the embedded defaults when empty).
func NewPrometheus(baseURL, queriesFile string) (*Prometheus, error) {
	u, err := url.Parse(baseURL)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return nil, fmt.Errorf("--prometheus-url %q is not a URL such as http://prometheus:9090", baseURL)
	}
	src, name := defaultQueries, "the embedded queries"
	if queriesFile != "" {
		if src, err = os.ReadFile(queriesFile); err != nil { //nolint:gosec // the operator names the queries file
			return nil, err
		}
		name = queriesFile
	}
	var cfg struct {
		Queries   map[string]string `json:"queries"`
		SampledAt map[string]string `json:"sampledAt"`
	}
	if err := yaml.UnmarshalStrict(src, &cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	client, err := promapi.NewClient(promapi.Config{Address: baseURL, Client: &http.Client{Timeout: queryTimeout}})
	if err != nil {
		return nil, fmt.Errorf("--prometheus-url %q: %w", baseURL, err)
	}
	p := &Prometheus{url: strings.TrimRight(baseURL, "/"), api: promv1.NewAPI(client),
		queries: map[string]*template.Template{}, sampledAt: map[string]*template.Template{}}
	for _, part := range []struct {
		key       string
		templates map[string]string
		into      map[string]*template.Template
	}{{"queries", cfg.Queries, p.queries}, {"sampledAt", cfg.SampledAt, p.sampledAt}} {
		for metric, q := range part.templates {
			if !slices.Contains(MetricNames, metric) {
				return nil, fmt.Errorf("%s: %s.%s: not a metric the adapter serves (%s)", name, part.key, metric, strings.Join(MetricNames, ", "))
			}
			t, err := template.New(metric).Option("missingkey=error").Parse(q)
			if err != nil {
				return nil, fmt.Errorf("%s: %s.%s: %w", name, part.key, metric, err)
			}
			part.into[metric] = t
		}
	}
	for metric := range p.sampledAt {
		if p.queries[metric] == nil {
			return nil, fmt.Errorf("%s: sampledAt.%s: no query for it in queries", name, metric)
		}
	}
	return p, nil
}

// Name implements Backend.
func (*Prometheus) Name() string { return "prometheus" }

// PromQL is the query the backend runs for q.
func (p *Prometheus) PromQL(q Query) (string, error) {
	t := p.queries[q.Metric]
	if t == nil {
		return "", ErrUnknownMetric
	}
	return expand(t, q)
}

func expand(t *template.Template, q Query) (string, error) {
	sel, err := matchers(q, "label_")
	if err != nil {
		return "", err
	}
	raw, err := matchers(Query{Selector: q.Selector}, "")
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	err = t.Execute(&b, map[string]string{"LeaseMatchers": sel, "SelectorMatchers": raw, "Namespace": q.Namespace,
		"LatencyQuantile": strconv.FormatFloat(LatencyQuantile, 'g', -1, 64)})
	return b.String(), err
}

// Query implements Backend.
func (p *Prometheus) Query(ctx context.Context, q Query) ([]Value, error) {
	promql, err := p.PromQL(q)
	if err != nil {
		return nil, err
	}
	values, err := p.instant(ctx, q.Metric, promql)
	t := p.sampledAt[q.Metric]
	if err != nil || len(values) == 0 || t == nil {
		return values, err
	}
	if promql, err = expand(t, q); err != nil {
		return nil, err
	}
	sampled, err := p.instant(ctx, q.Metric, promql)
	if err != nil {
		return nil, err
	}
	for i := range values {
		values[i].Time = sampledTime(values[i], sampled)
	}
	return values, nil
}

// sampledTime dates v by the sampledAt answer with its labels (or the one
// answer without labels): the older of that and v's evaluation time. A
// value it gives no time for is dated zero, which the freshness guard
// refuses: its age is not known.
func sampledTime(v Value, sampled []Value) time.Time {
	for _, s := range sampled {
		if (len(sampled) == 1 && len(s.Labels) == 0) || maps.Equal(s.Labels, v.Labels) {
			if at := unixTime(s.Value); at.Before(v.Time) {
				return at
			}
			return v.Time
		}
	}
	return time.Time{}
}

// instant runs an instant query at the server's now; each sample of the
// answer is a Value dated at evaluation, NaN and infinities left out (0/0
// where nothing matched: no data). An answer with warnings is refused:
// Prometheus warns when part of the data did not answer (a remote store)
// or a histogram's buckets are malformed, and the adapter serves no value
// it cannot vouch for.
func (p *Prometheus) instant(ctx context.Context, metric, promql string) ([]Value, error) {
	result, warnings, _, err := p.api.Query(ctx, promql, time.Time{}, promv1.WithTimeout(queryTimeout))
	if err != nil {
		return nil, fmt.Errorf("%s: %w (query: %s)", p.url, err, promql)
	}
	if len(warnings) > 0 {
		return nil, fmt.Errorf("%s warns: %s (query: %s)", p.url, strings.Join(warnings, "; "), promql)
	}
	vector, ok := result.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("%s: query for %s gives a %s, want a vector", p.url, metric, result.Type())
	}
	var out []Value
	for _, s := range vector {
		v := float64(s.Value)
		if math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		labels := map[string]string{}
		for name, value := range s.Metric {
			if name != model.MetricNameLabel {
				labels[string(name)] = string(value)
			}
		}
		out = append(out, Value{Labels: labels, Value: v, Time: s.Timestamp.Time()})
	}
	return out, nil
}

// unixTime reads a Prometheus time: seconds, to the millisecond.
func unixTime(seconds float64) time.Time {
	return time.UnixMilli(int64(math.Round(seconds * 1000)))
}

// matchers writes the namespace (when set) and the selector as PromQL
// label matchers, selector keys prefixed and made label names.
func matchers(q Query, prefix string) (string, error) {
	var out []string
	if q.Namespace != "" {
		out = append(out, "namespace="+strconv.Quote(q.Namespace))
	}
	reqs, _ := q.Selector.Requirements()
	for _, r := range reqs {
		name := prefix + api.LabelName(r.Key())
		values := r.ValuesUnsorted()
		slices.Sort(values)
		var m string
		switch r.Operator() {
		case selection.Equals, selection.DoubleEquals:
			m = name + "=" + strconv.Quote(values[0])
		case selection.NotEquals:
			m = name + "!=" + strconv.Quote(values[0])
		case selection.In:
			m = name + "=~" + strconv.Quote(alternatives(values))
		case selection.NotIn:
			m = name + "!~" + strconv.Quote(alternatives(values))
		case selection.Exists:
			m = name + `!=""`
		case selection.DoesNotExist:
			m = name + `=""`
		default:
			return "", &SelectorError{Selector: q.Selector.String(), Key: r.Key(), Operator: string(r.Operator()),
				Limit: "has no PromQL label matcher; the Prometheus backend takes =, !=, in, notin, exists and !"}
		}
		out = append(out, m)
	}
	return strings.Join(out, ","), nil
}

func alternatives(values []string) string {
	q := make([]string, len(values))
	for i, v := range values {
		q[i] = regexp.QuoteMeta(v)
	}
	return strings.Join(q, "|")
}

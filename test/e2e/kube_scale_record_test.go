package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/simulate"
	e2ekube "github.com/gpupool/gpupool/test/e2e/kube"
)

// extenderCall is one of the placer's records of a kube-scheduler call
// (at -v=2, as JSON: slog's in gpupool-scheduler's log for the extender,
// klog's in kube-scheduler's for the plugin): a filter with the
// allocator's answer, or a bind.
type extenderCall struct {
	Msg    string `json:"msg"`
	Pod    podKey `json:"pod"`
	UID    string `json:"uid"`
	Nodes  int    `json:"nodes"`
	Result string `json:"result"`
	Server string `json:"server"`
	Node   string `json:"node"`
	Lease  string `json:"lease"`
	Err    string `json:"err"`
	Took   took   `json:"took"`
	// Time is when the call ended: when it was logged (slog's time).
	Time time.Time `json:"time"`
	// TS is klog's time: milliseconds since the epoch.
	TS float64 `json:"ts"`
}

// took is a duration as slog's JSON writes it (nanoseconds) or klog's (a
// string, "1.5ms").
type took time.Duration

func (d *took) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) != nil {
		return json.Unmarshal(b, (*int64)(d))
	}
	v, err := time.ParseDuration(s)
	*d = took(v)
	return err
}

// podKey is a record's pod, namespace/name. kube-scheduler's logger
// carries the pod of the cycle as an object ({"name", "namespace"}) before
// the record's own string: a line of the plugin's has both, and the last
// one read is kept.
type podKey string

func (p *podKey) UnmarshalJSON(b []byte) error {
	var ref struct{ Name, Namespace string }
	if json.Unmarshal(b, &ref) == nil {
		*p = podKey(ref.Namespace + "/" + ref.Name)
		return nil
	}
	return json.Unmarshal(b, (*string)(p))
}

func (c *extenderCall) start() time.Time { return c.Time.Add(-time.Duration(c.Took)) }

// extenderCalls reads the filter and bind records, in the order they were
// logged, from the lines of logs that begin with prefix (gpupool-scheduler's
// in the harness's log; none in kube-scheduler's own, the plugin's), and
// how many of the pod's leases were released to place the pod again.
func extenderCalls(logs, prefix string) (calls []extenderCall, released int, err error) {
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), prefix)
		if !ok || !strings.HasPrefix(line, "{") {
			continue
		}
		var c extenderCall
		if json.Unmarshal([]byte(line), &c) != nil {
			continue
		}
		if c.Time.IsZero() && c.TS != 0 {
			c.Time = time.UnixMicro(int64(c.TS * 1000))
		}
		switch c.Msg {
		case verbFilterRecord, verbBindRecord:
			calls = append(calls, c)
		case "filter: released the pod's lease to place it again", pluginReleasedToPlaceAgain:
			released++
		}
	}
	return calls, released, sc.Err()
}

const (
	verbFilterRecord = "filter"
	verbBindRecord   = "bind"
	// pluginReleasedToPlaceAgain is the plugin's line for a lease released
	// because kube-scheduler's filters refused its node.
	pluginReleasedToPlaceAgain = "released the lease of a pod whose node kube-scheduler's filters refused: it is placed among the feasible nodes next"
)

// scaleRecord is what explains where a BenchmarkKubeScale run placed the
// pods: every call kube-scheduler made to the pool with its answer, the
// pods as kube-apiserver has them at the end, and the allocator's leases.
type scaleRecord struct {
	calls    []extenderCall
	released int
	pods     []corev1.Pod
	leases   []api.Lease
}

// arrival is the arrival index of the pod named namespace/pod-NNNNN.
func arrival(name string) (int, bool) {
	_, name, _ = strings.Cut(name, "/")
	i, err := strconv.Atoi(strings.TrimPrefix(name, "pod-"))
	return i, err == nil
}

// liveOrder is the pods in the order the allocator first granted them a
// lease through a filter, then those it never granted, in arrival order:
// what simulate.PlaceInOrder replays to tell what the order costs from
// what anything else costs. outOfOrder counts the grants that came after
// a grant to a pod that arrived later.
func (r *scaleRecord) liveOrder(arrivals []simulate.Pod) (order []simulate.Pod, outOfOrder int) {
	granted := make([]bool, len(arrivals))
	latest := -1
	for _, c := range r.calls {
		i, ok := arrival(string(c.Pod))
		if c.Msg != verbFilterRecord || c.Result != "placed" || !ok || i >= len(arrivals) || granted[i] {
			continue
		}
		granted[i] = true
		order = append(order, arrivals[i])
		if i < latest {
			outOfOrder++
		}
		latest = max(latest, i)
	}
	for i := range arrivals {
		if !granted[i] {
			order = append(order, arrivals[i])
		}
	}
	return order, outOfOrder
}

// digits are normalised out of the reasons tallied, so that "0/1213 nodes"
// and the counts of nodes per reason group together.
var digits = regexp.MustCompile(`[0-9]+`)

// unboundCauses tallies the pods left unbound by why kube-scheduler last
// said it could not place them.
func (r *scaleRecord) unboundCauses() map[string]int {
	causes := map[string]int{}
	for i := range r.pods {
		pod := &r.pods[i]
		if pod.Spec.NodeName != "" {
			continue
		}
		why := "no PodScheduled condition"
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled {
				why = c.Reason + ": " + digits.ReplaceAllString(c.Message, "N")
			}
		}
		causes[why]++
	}
	return causes
}

// leaseAudit compares the allocator's leases with the pods: at the end
// of a run they must be exactly the bound pods' leases, one each, on the
// pod's node, the one its annotation names.
type leaseAudit struct {
	heldByUnbound, heldByGone, boundWithout, wrongNode, wrongAnnotation, extra int
}

func (r *scaleRecord) audit() leaseAudit {
	var a leaseAudit
	byUID := map[string][]api.Lease{}
	for _, l := range r.leases {
		byUID[l.Owner.UID] = append(byUID[l.Owner.UID], l)
	}
	seen := map[string]bool{}
	for i := range r.pods {
		pod := &r.pods[i]
		uid := string(pod.UID)
		seen[uid] = true
		held := byUID[uid]
		if len(held) > 1 {
			a.extra += len(held) - 1
		}
		switch {
		case pod.Spec.NodeName == "" && len(held) > 0:
			a.heldByUnbound += len(held)
		case pod.Spec.NodeName != "" && len(held) == 0:
			a.boundWithout++
		case pod.Spec.NodeName != "":
			if held[0].Server != pod.Spec.NodeName {
				a.wrongNode++
			}
			if held[0].ID != pod.Annotations[kube.AnnotationLease] {
				a.wrongAnnotation++
			}
		}
	}
	for uid, held := range byUID {
		if !seen[uid] {
			a.heldByGone += len(held)
		}
	}
	return a
}

func (a leaseAudit) clean() bool { return a == leaseAudit{} }

func (a leaseAudit) String() string {
	return fmt.Sprintf("leases held by unbound pods %d, by pods gone %d; bound pods without a lease %d; on another node than the pod %d; "+
		"not the pod's annotation %d; more than one a pod %d", a.heldByUnbound, a.heldByGone, a.boundWithout, a.wrongNode, a.wrongAnnotation, a.extra)
}

// report logs the record: the calls by verb and answer, their times, the
// unbound pods by cause, the lease audit, and the live order replayed,
// told the trace's task types and learning them as the allocator does.
func (r *scaleRecord) report(b *testing.B, tr *simulate.Trace, arrivals []simulate.Pod) {
	b.Helper()
	answers := map[string]int{}
	perPod := map[string]int{}
	var filterTook, bindTook []time.Duration
	var candidates []int
	amongAll := 0
	for _, c := range r.calls {
		key := c.Msg + " " + c.Result
		if c.Msg == verbBindRecord {
			key = "bind ok"
			if c.Err != "" {
				key = "bind error: " + digits.ReplaceAllString(firstLine(c.Err, 80), "N")
			}
			bindTook = append(bindTook, time.Duration(c.Took))
		} else {
			if c.Result != "placed" {
				key += ": " + digits.ReplaceAllString(firstLine(c.Err, 80), "N")
			}
			perPod[c.UID]++
			filterTook = append(filterTook, time.Duration(c.Took))
			if c.Nodes > 0 {
				candidates = append(candidates, c.Nodes)
			} else {
				// The plugin's PreFilter asks among all the pool's servers.
				amongAll++
			}
		}
		answers[key]++
	}
	retried := 0
	for _, n := range perPod {
		if n > 1 {
			retried++
		}
	}
	fmt.Printf("the record: %d calls; %d pods filtered more than once; %d leases released to place a pod again\n%s",
		len(r.calls), retried, r.released, tally(answers))
	fmt.Println()
	fmt.Printf("filter took p50 %v p99 %v max %v; bind took p50 %v p99 %v max %v",
		quantileOf(filterTook, 0.5), quantileOf(filterTook, 0.99), quantileOf(filterTook, 1),
		quantileOf(bindTook, 0.5), quantileOf(bindTook, 0.99), quantileOf(bindTook, 1))
	fmt.Println()
	slices.Sort(candidates)
	if amongAll > 0 {
		fmt.Printf("acquisitions among all the pool's servers, before kube-scheduler's filters: %d\n", amongAll)
	}
	if len(candidates) > 0 {
		fewer := 0
		for _, n := range candidates {
			if n < len(tr.Servers)*9/10 {
				fewer++
			}
		}
		fmt.Printf("candidate nodes a filter: min %d, p1 %d, p50 %d, max %d; %d filters among fewer than 90%% of the %d nodes\n",
			candidates[0], candidates[len(candidates)/100], candidates[len(candidates)/2], candidates[len(candidates)-1], fewer, len(tr.Servers))
	}
	fmt.Printf("unbound pods by cause:\n%s", tally(r.unboundCauses()))
	fmt.Printf("at the end: %v\n", r.audit())
	order, outOfOrder := r.liveOrder(arrivals)
	live, err := simulate.PlaceInOrder(tr, order, scalePolicy, scaleSeed)
	if err != nil {
		b.Fatal(err)
	}
	learnt, err := simulate.PlaceAsLearnt(tr, order, scalePolicy, scaleSeed)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Printf("the allocator's live order replayed in-process: %.2f%% unallocated told the trace's task types, %.2f%% learning them as the allocator does; %d grants came after a later pod's\n",
		live, learnt, outOfOrder)
	b.ReportMetric(live, "live-order-replay-unallocated-%")
	b.ReportMetric(learnt, "live-order-learnt-unallocated-%")
	b.ReportMetric(float64(retried), "pods-filtered-again")
}

// pathStages are the stages of a pod's way from creation to bound, as
// the run and the record time them.
var pathStages = []string{"Create call", "to the first filter", "first filter to bind", "bind", "bind to seen bound"}

// path prints where the bound pods spent the time from creation to bound:
// the Create call (admission); from its answer to the start of the first
// filter (kube-scheduler's queue, and its own filters of the nodes); from
// there to the start of the bind (filters again, kube-scheduler's reserve
// and permit, its binding goroutine); the bind; from the bind's answer to
// the benchmark's informer seeing the pod bound. For all pods and for
// the slowest 1%: the p99 is theirs.
func (r *scaleRecord) path(run *scaleRun) {
	type way struct {
		stages  []time.Duration
		total   time.Duration
		filters int
		arrival int
	}
	firstFilter, bind := map[int]*extenderCall{}, map[int]*extenderCall{}
	filters := map[int]int{}
	for k := range r.calls {
		c := &r.calls[k]
		i, ok := arrival(string(c.Pod))
		if !ok {
			continue
		}
		switch {
		case c.Msg == verbFilterRecord:
			filters[i]++
			if firstFilter[i] == nil {
				firstFilter[i] = c
			}
		case c.Msg == verbBindRecord && c.Err == "":
			bind[i] = c
		}
	}
	run.mu.Lock()
	var ways []way
	for i, bound := range run.bound {
		f, b := firstFilter[i], bind[i]
		if bound.IsZero() || f == nil || b == nil || run.admitted[i].IsZero() {
			continue
		}
		ways = append(ways, way{total: bound.Sub(run.created[i]), filters: filters[i], arrival: i, stages: []time.Duration{
			run.admitted[i].Sub(run.created[i]), f.start().Sub(run.admitted[i]), b.start().Sub(f.start()), time.Duration(b.Took), bound.Sub(b.Time)}})
	}
	run.mu.Unlock()
	if len(ways) == 0 {
		return
	}
	slices.SortFunc(ways, func(a, b way) int { return cmp.Compare(a.total, b.total) })
	slowest := ways[len(ways)*99/100:]
	again := 0
	arrived := make([]int, len(slowest))
	for k, w := range slowest {
		if w.filters > 1 {
			again++
		}
		arrived[k] = w.arrival
	}
	slices.Sort(arrived)
	fmt.Printf("where a bound pod's time goes (p50 of each stage, all %d pods | mean over the slowest %d, %d of them filtered more than once, created %d-th to %d-th, p50 %d-th):\n",
		len(ways), len(slowest), again, arrived[0], arrived[len(arrived)-1], arrived[len(arrived)/2])
	for s, name := range pathStages {
		all := make([]time.Duration, len(ways))
		for k, w := range ways {
			all[k] = w.stages[s]
		}
		var sum time.Duration
		for _, w := range slowest {
			sum += w.stages[s]
		}
		fmt.Printf("  %-22s %9v | %9v\n", name, quantileOf(all, 0.5), (sum / time.Duration(len(slowest))).Round(100*time.Microsecond))
	}
	r.timeline(run, firstFilter)
}

// timeline prints, for each 10 s of the run from the first create, the
// filters the pool answered (placed, refused) with the seconds they took,
// and the p50 and max wait from the Create call's answer to the first
// filter (firstFilter, by arrival) of the pods created then.
func (r *scaleRecord) timeline(run *scaleRun, firstFilter map[int]*extenderCall) {
	type slot struct {
		placed, refused int
		took            time.Duration
		waits           []time.Duration
	}
	var slots []slot
	run.mu.Lock()
	start := run.created[0]
	for i, f := range firstFilter {
		if i < len(run.admitted) && !run.admitted[i].IsZero() {
			at := tenSeconds(&slots, start, run.created[i])
			at.waits = append(at.waits, f.start().Sub(run.admitted[i]))
		}
	}
	run.mu.Unlock()
	for k := range r.calls {
		if c := &r.calls[k]; c.Msg == verbFilterRecord {
			at := tenSeconds(&slots, start, c.start())
			at.took += time.Duration(c.Took)
			if c.Result == "placed" {
				at.placed++
			} else {
				at.refused++
			}
		}
	}
	fmt.Println("the run by 10 s: filters placed / refused (s they took); pods created then, wait to the first filter p50 / max")
	for k, b := range slots {
		fmt.Printf("  %4ds %5d / %4d (%5.1f s)   %4d pods %9v / %9v\n", 10*k, b.placed, b.refused, b.took.Seconds(),
			len(b.waits), quantileOf(b.waits, 0.5), quantileOf(b.waits, 1))
	}
}

// tally lists counts, the largest first, at most 8 lines.
func tally(counts map[string]int) string {
	keys := slices.Collect(maps.Keys(counts))
	slices.SortFunc(keys, func(a, b string) int { return counts[b] - counts[a] })
	var out strings.Builder
	for i, k := range keys {
		if i == 8 {
			fmt.Fprintf(&out, "  ... %d more\n", len(keys)-i)
			break
		}
		fmt.Fprintf(&out, "  %6d  %s\n", counts[k], k)
	}
	return out.String()
}

func firstLine(s string, n int) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > n {
		s = s[:n]
	}
	return s
}

// quantileOf is d's q-quantile by nearest rank: of a few samples, the
// 0.99-quantile is the largest, not the one below it.
func quantileOf(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[max(0, int(math.Ceil(q*float64(len(s))))-1)].Round(100 * time.Microsecond)
}

// schedulerLoop says where kube-scheduler's one scheduling loop spent its
// time in the run, from its own metrics: its attempts by result, with
// the seconds they took; the extension points' seconds; and the events
// that sent pods back to its queues. Read at the end of a side, on a
// control plane of its own, it is that side's.
func schedulerLoop(b testing.TB, ctx context.Context, cp *e2ekube.ControlPlane) string {
	b.Helper()
	text, err := cp.SchedulerMetrics(ctx)
	if err != nil {
		b.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		b.Fatal(err)
	}
	sums := func(family, label string) (count map[string]uint64, seconds map[string]float64) {
		count, seconds = map[string]uint64{}, map[string]float64{}
		for _, m := range families[family].GetMetric() {
			key := labelValue(m, label)
			count[key] += m.GetHistogram().GetSampleCount()
			seconds[key] += m.GetHistogram().GetSampleSum()
		}
		return count, seconds
	}
	var out strings.Builder
	count, seconds := sums("scheduler_scheduling_attempt_duration_seconds", "result")
	fmt.Fprintf(&out, "kube-scheduler's attempts:")
	for _, result := range slices.Sorted(maps.Keys(count)) {
		fmt.Fprintf(&out, " %d %s, %.1f s (%.1f ms each);", count[result], result, seconds[result],
			1000*seconds[result]/float64(max(count[result], 1)))
	}
	count, seconds = sums("scheduler_framework_extension_point_duration_seconds", "extension_point")
	fmt.Fprintf(&out, "\n  its extension points, seconds:")
	for _, point := range slices.Sorted(maps.Keys(count)) {
		fmt.Fprintf(&out, " %s %.1f;", point, seconds[point])
	}
	queued := map[string]float64{}
	for _, m := range families["scheduler_queue_incoming_pods_total"].GetMetric() {
		queued[labelValue(m, "event")+" to "+labelValue(m, "queue")] += m.GetCounter().GetValue()
	}
	fmt.Fprintf(&out, "\n  pods into its queues by event:")
	for _, k := range slices.Sorted(maps.Keys(queued)) {
		fmt.Fprintf(&out, " %s %.0f;", k, queued[k])
	}
	return out.String() + "\n"
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestPluginRecordsAreRead: a record of gpupool-kube-scheduler's plugin,
// as kube-scheduler's JSON logger writes it (the cycle's pod as an object,
// then the record's own), is read, as is gpupool-scheduler's.
func TestPluginRecordsAreRead(t *testing.T) {
	plugin := `{"ts":1764430000000.5,"caller":"scheduler/placer.go:153","msg":"filter","v":2,"pod":{"name":"pod-00007","namespace":"openb"},"pod":"openb/pod-00007","uid":"u7","nodes":1213,"result":"placed","server":"openb-node-0001","lease":"lease-000007","err":"","took":"2.5ms"}`
	extender := `gpupool-scheduler: {"time":"2026-11-29T18:00:00Z","level":"DEBUG","msg":"bind","pod":"openb/pod-00008","uid":"u8","node":"openb-node-0002","lease":"lease-000008","err":"","took":1500000}`
	for _, c := range []struct {
		logs, prefix, pod string
		took              time.Duration
	}{{plugin, "", "openb/pod-00007", 2500 * time.Microsecond}, {extender, "gpupool-scheduler: ", "openb/pod-00008", 1500 * time.Microsecond}} {
		calls, _, err := extenderCalls(c.logs, c.prefix)
		if err != nil || len(calls) != 1 || string(calls[0].Pod) != c.pod || time.Duration(calls[0].Took) != c.took {
			t.Errorf("%s: %+v, %v; want one call of %s that took %v", c.logs, calls, err, c.pod, c.took)
		}
	}
}

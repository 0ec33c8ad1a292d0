package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/simulate"
)

// extenderCall is one of gpupool-scheduler's records of a kube-scheduler
// call (its debug log, as JSON): a filter with the allocator's answer, or
// a bind.
type extenderCall struct {
	Msg    string `json:"msg"`
	Pod    string `json:"pod"`
	UID    string `json:"uid"`
	Nodes  int    `json:"nodes"`
	Result string `json:"result"`
	Server string `json:"server"`
	Node   string `json:"node"`
	Lease  string `json:"lease"`
	Err    string `json:"err"`
	Took   int64  `json:"took"` // nanoseconds, as slog's JSON writes a duration
}

// extenderCalls reads the filter and bind records, in the order
// gpupool-scheduler logged them, from logs, and how many of the pod's
// leases it released to place the pod again.
func extenderCalls(logs string) (calls []extenderCall, released int) {
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "gpupool-scheduler: ")
		if !ok || !strings.HasPrefix(line, "{") {
			continue
		}
		var c extenderCall
		if json.Unmarshal([]byte(line), &c) != nil {
			continue
		}
		switch c.Msg {
		case verbFilterRecord, verbBindRecord:
			calls = append(calls, c)
		case "filter: released the pod's lease to place it again":
			released++
		}
	}
	return calls, released
}

const (
	verbFilterRecord = "filter"
	verbBindRecord   = "bind"
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
		i, ok := arrival(c.Pod)
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
			candidates = append(candidates, c.Nodes)
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

func quantileOf(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))].Round(100 * time.Microsecond)
}

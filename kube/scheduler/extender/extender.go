// Package extender is the placer's front end for an upstream
// kube-scheduler: its HTTP extender, which gpupool-scheduler serves with
// --listen where a cluster runs the stock kube-scheduler configured with
// an extender, not gpupool-kube-scheduler.
package extender

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpupool/gpupool/kube/scheduler"
)

// Extender is the scheduler.Placer's front end for an upstream kube-scheduler, as
// its HTTP extender (gpupool-scheduler --listen): kube-scheduler filters
// the nodes it can (node selectors, taints, CPU, memory), then calls
// POST /filter with the feasible node names, answered with the lease's
// server as the only node left, and POST /bind. The extender protocol has
// no Unreserve: a lease whose pod is not bound within the placer's
// UnboundLeaseTimeout is released.
type Extender struct {
	placer *scheduler.Placer
	log    logr.Logger
	// names are the node names kube-scheduler sent so far.
	names nameTable
}

// New returns the extender over placer, logging to log; Handler serves
// it.
func New(placer *scheduler.Placer, log logr.Logger) *Extender {
	return &Extender{placer: placer, log: log}
}

// filter answers kube-scheduler's filter call: the lease's server as the
// only feasible node. A pod the pool cannot place now fails on every
// candidate with the reason, which kube-scheduler's FailedScheduling
// event repeats; a placer that cannot answer is an Error, which the event
// repeats too.
func (e *Extender) filter(ctx context.Context, args *filterArgs) *extenderv1.ExtenderFilterResult {
	var malformed string
	switch {
	case args.Pod == nil:
		malformed = "gpupool scheduler: the filter call names no pod"
	case !args.NodeNames.given:
		// Whole nodes for every pod would be megabytes per call at a
		// thousand nodes; the names are all the allocator needs.
		malformed = "gpupool scheduler: kube-scheduler sent nodes, not node names: set nodeCacheCapable: true in its extender configuration"
	}
	if malformed != "" {
		e.placer.CountUnreadable(scheduler.VerbFilter, time.Now())
		return &extenderv1.ExtenderFilterResult{Error: malformed}
	}
	nodes := args.NodeNames.names
	server, err := e.placer.Filter(ctx, *args.Pod, nodes)
	switch {
	case err == nil && server == "":
		return &extenderv1.ExtenderFilterResult{NodeNames: &[]string{}}
	case err == nil:
		return &extenderv1.ExtenderFilterResult{NodeNames: &[]string{server}}
	case scheduler.Unschedulable(err):
		return unschedulable(nodes, err.Error())
	}
	return &extenderv1.ExtenderFilterResult{Error: err.Error()}
}

// unschedulable fails every node with why. Unresolvable: kube-scheduler's
// preemption only frees what its own filters count, never a GPU share, so
// evicting pods for this one would be for nothing.
func unschedulable(nodes []string, why string) *extenderv1.ExtenderFilterResult {
	failed := make(extenderv1.FailedNodesMap, len(nodes))
	for _, n := range nodes {
		failed[n] = why
	}
	return &extenderv1.ExtenderFilterResult{FailedAndUnresolvableNodes: failed}
}

// bind answers kube-scheduler's bind call (Placer.Bind).
func (e *Extender) bind(ctx context.Context, args *extenderv1.ExtenderBindingArgs) *extenderv1.ExtenderBindingResult {
	pod := scheduler.PodRef{Namespace: args.PodNamespace, Name: args.PodName, UID: args.PodUID}
	if err := e.placer.Bind(ctx, pod, args.Node); err != nil {
		return &extenderv1.ExtenderBindingResult{Error: err.Error()}
	}
	return &extenderv1.ExtenderBindingResult{}
}

// maxBody bounds a call's body: a pod (at most etcd's 1.5 MiB) and the
// candidate node names (allocator.MaxServers, 100,000 names of 63
// characters, the usual longest, are 6.5 MB).
const maxBody = 16 << 20

// Handler serves POST /filter and POST /bind, the verbs kube-scheduler's
// extender configuration names (filterVerb: filter, bindVerb: bind).
// Every answer is 200 with the extender's result: kube-scheduler reports
// another status only by its number, and an Error in the result by its
// text, which is what a pod's FailedScheduling event should say.
func (e *Extender) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /"+scheduler.VerbFilter, serve(e, scheduler.VerbFilter, e.resetFilterArgs, e.filter,
		func(msg string) *extenderv1.ExtenderFilterResult { return &extenderv1.ExtenderFilterResult{Error: msg} }))
	mux.Handle("POST /"+scheduler.VerbBind, serve(e, scheduler.VerbBind, func(a *extenderv1.ExtenderBindingArgs) { *a = extenderv1.ExtenderBindingArgs{} }, e.bind,
		func(msg string) *extenderv1.ExtenderBindingResult {
			return &extenderv1.ExtenderBindingResult{Error: msg}
		}))
	return mux
}

// resetFilterArgs empties filter arguments for the next call but keeps
// the node names' slice, which the next call's names are decoded into.
func (e *Extender) resetFilterArgs(a *filterArgs) {
	*a = filterArgs{NodeNames: nodeNames{names: a.NodeNames.names[:0], known: &e.names}}
}

// serve answers one verb: it decodes the call into pooled arguments
// (emptied by reset), calls the verb with the extender's logger in its
// context, and encodes the answer through a pooled buffer; failed is the
// verb's answer to a call it could not read, or that reached no placer,
// which serve counts (the placer counts the calls it answers, filter
// those it refuses before).
func serve[A, R any](e *Extender, verb string, reset func(*A), call func(context.Context, *A) *R, failed func(string) *R) http.Handler {
	pool := sync.Pool{New: func() any { return new(A) }}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		args := pool.Get().(*A)
		defer pool.Put(args)
		reset(args)
		buf := buffers.Get().(*bytes.Buffer)
		defer buffers.Put(buf)
		buf.Reset()

		var answer *R
		if err := decode(w, r, buf, args); err != nil {
			answer = failed(fmt.Sprintf("gpupool scheduler: the %s call: %v", verb, err))
			e.placer.CountUnreadable(verb, start)
		} else {
			answer = call(klog.NewContext(r.Context(), e.log), args)
		}
		buf.Reset()
		if err := json.NewEncoder(buf).Encode(answer); err != nil {
			answer = failed(fmt.Sprintf("gpupool scheduler: encoding the %s answer: %v", verb, err))
			buf.Reset()
			_ = json.NewEncoder(buf).Encode(answer) // a result holding only an error string encodes
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(buf.Bytes())
	})
}

// decode reads r's JSON body through buf into v.
func decode(w http.ResponseWriter, r *http.Request, buf *bytes.Buffer, v any) error {
	if r.ContentLength > 0 && r.ContentLength <= maxBody {
		buf.Grow(int(r.ContentLength))
	}
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, maxBody)); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return fmt.Errorf("body larger than %d bytes", tooLarge.Limit)
		}
		return err
	}
	if u, ok := v.(json.Unmarshaler); ok {
		// One scan to check the JSON, one to read it: json.Unmarshal
		// would scan it a third time to find where it ends.
		if !json.Valid(buf.Bytes()) {
			return json.Unmarshal(buf.Bytes(), new(any)) // says where and why
		}
		return u.UnmarshalJSON(buf.Bytes())
	}
	return json.Unmarshal(buf.Bytes(), v)
}

// buffers carry bodies in and answers out, one per call at a time.
var buffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

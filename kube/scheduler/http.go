package scheduler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

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
	mux.Handle("POST /"+verbFilter, serve(e, verbFilter, e.resetFilterArgs, e.filter,
		func(msg string) *extenderv1.ExtenderFilterResult { return &extenderv1.ExtenderFilterResult{Error: msg} }))
	mux.Handle("POST /"+verbBind, serve(e, verbBind, func(a *extenderv1.ExtenderBindingArgs) { *a = extenderv1.ExtenderBindingArgs{} }, e.bind,
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
// (emptied by reset), calls the verb, encodes the answer through a pooled
// buffer and counts the call; failed is the verb's answer to a call it
// could not read.
func serve[A, R any](e *Extender, verb string, reset func(*A), call func(context.Context, *A) (*R, result), failed func(string) *R) http.Handler {
	pool := sync.Pool{New: func() any { return new(A) }}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		args := pool.Get().(*A)
		defer pool.Put(args)
		reset(args)
		buf := buffers.Get().(*bytes.Buffer)
		defer buffers.Put(buf)
		buf.Reset()

		var (
			answer *R
			res    result
		)
		if err := decode(w, r, buf, args); err != nil {
			answer, res = failed(fmt.Sprintf("gpupool extender: the %s call: %v", verb, err)), resultError
		} else {
			answer, res = call(r.Context(), args)
		}
		buf.Reset()
		if err := json.NewEncoder(buf).Encode(answer); err != nil {
			answer, res = failed(fmt.Sprintf("gpupool extender: encoding the %s answer: %v", verb, err)), resultError
			buf.Reset()
			_ = json.NewEncoder(buf).Encode(answer) // a result holding only an error string encodes
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(buf.Bytes())
		e.metrics.answered(verb, res, start)
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

package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
)

// maxBody bounds request bodies; a server with 64 GPUs fits well within.
const maxBody = 1 << 20

// Handler serves the /v1 API, /metrics and /healthz. With auth nil every
// request acts as admin (for the embedded demo on loopback).
func Handler(s *Service, auth *Authenticator, gatherer prometheus.Gatherer, log *slog.Logger) http.Handler {
	h := &handler{s: s, auth: auth, log: log}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/servers/{name}", h.registerServer)
	mux.HandleFunc("POST /v1/servers/{name}/heartbeat", h.heartbeat)
	mux.HandleFunc("POST /v1/leases", h.acquire)
	mux.HandleFunc("GET /v1/leases", h.listLeases)
	mux.HandleFunc("GET /v1/leases/{id}", h.getLease)
	mux.HandleFunc("POST /v1/leases/{id}/renew", h.renew)
	mux.HandleFunc("DELETE /v1/leases/{id}", h.release)
	mux.HandleFunc("GET /v1/pool", h.pool)
	mux.HandleFunc("GET /v1/quotas", h.quotas)
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-s.Failed():
			http.Error(w, "store failed", http.StatusServiceUnavailable)
		default:
			_, _ = io.WriteString(w, "ok\n")
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { notFound(mux, w, r) })
	return mux
}

// notFound answers a path no route serves, or a method its routes do not
// take, with the API's JSON error rather than the mux's plain text.
func notFound(mux *http.ServeMux, w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodPost, http.MethodDelete} {
		other := r.Clone(r.Context())
		other.Method = m
		if _, pattern := mux.Handler(other); pattern != "/" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		api.WriteError(w, http.StatusMethodNotAllowed, &api.Error{Reason: api.ReasonMethodNotAllowed,
			Message: r.Method + " is not allowed on " + r.URL.Path + "; allowed: " + strings.Join(allow, ", ")})
		return
	}
	api.WriteError(w, http.StatusNotFound, &api.Error{Reason: api.ReasonNotFound, Message: "no such path " + r.URL.Path + " (the API is under /v1, see docs/allocator.md)"})
}

type handler struct {
	s    *Service
	auth *Authenticator
	log  *slog.Logger
}

// principal authenticates the request, answering 401 itself when it fails.
func (h *handler) principal(w http.ResponseWriter, r *http.Request) (Principal, bool) {
	if h.auth == nil {
		return Principal{Admin: true}, true
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if ok {
		if p, known := h.auth.Lookup(token); known {
			return p, true
		}
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="gpupool"`)
	api.WriteError(w, http.StatusUnauthorized, &api.Error{Reason: api.ReasonUnauthorized, Message: "missing or unknown bearer token"})
	return Principal{}, false
}

// serverPrincipal authenticates the daemon of the server the path names
// (or an admin), answering 401 or 403 itself when it is not.
func (h *handler) serverPrincipal(w http.ResponseWriter, r *http.Request) bool {
	p, ok := h.principal(w, r)
	if ok && !p.mayServe(r.PathValue("name")) {
		h.fail(w, &ForbiddenError{Server: r.PathValue("name")})
		return false
	}
	return ok
}

func (h *handler) registerServer(w http.ResponseWriter, r *http.Request) {
	if !h.serverPrincipal(w, r) {
		return
	}
	var srv api.Server
	if !decode(w, r, &srv) {
		return
	}
	if name := r.PathValue("name"); srv.Name != name {
		h.fail(w, &allocator.FieldError{Field: "name", Value: srv.Name, Limit: "must equal the name in the path, " + name})
		return
	}
	h.reply(w, http.StatusOK, srv, h.s.RegisterServer(r.Context(), srv.Core()))
}

func (h *handler) heartbeat(w http.ResponseWriter, r *http.Request) {
	if !h.serverPrincipal(w, r) {
		return
	}
	var hb api.Heartbeat
	if !decode(w, r, &hb) {
		return
	}
	h.reply(w, http.StatusNoContent, nil, h.s.Heartbeat(r.Context(), r.PathValue("name"), hb))
}

func (h *handler) acquire(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	p, ok := h.principal(w, r)
	if !ok {
		return
	}
	var in api.AcquireRequest
	if !decode(w, r, &in) {
		return
	}
	req, wait, err := in.Parse()
	if err == nil && !p.mayUse(req.Namespace) {
		err = &ForbiddenError{Namespace: req.Namespace}
	}
	if err != nil {
		h.s.metrics.acquired(start, reason(err))
		h.fail(w, err)
		return
	}
	if wait > 0 {
		// A queued request outlives the server's write timeout by design.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + time.Minute))
	}
	l, err := h.s.Acquire(r.Context(), req, wait)
	h.reply(w, http.StatusCreated, api.NewLease(l), err)
}

func (h *handler) listLeases(w http.ResponseWriter, r *http.Request) {
	p, ok := h.principal(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	f := LeaseFilter{Namespace: q.Get("namespace"), Server: q.Get("server")}
	switch {
	case p.Admin:
	case p.Server:
		// A daemon reads the leases placed on its own server, of every
		// namespace, and nothing else.
		if f.Server == "" {
			f.Server = p.ServerName
		}
		if f.Server == "" {
			h.fail(w, &allocator.FieldError{Field: "server", Value: "", Limit: "must name the server whose leases a servers token lists"})
			return
		}
		if !p.mayServe(f.Server) {
			h.fail(w, &ForbiddenError{Server: f.Server})
			return
		}
	default:
		if f.Namespace == "" {
			f.Namespace = p.Namespace
		}
		if !p.mayUse(f.Namespace) {
			h.fail(w, &ForbiddenError{Namespace: f.Namespace})
			return
		}
	}
	if sel := q.Get("selector"); sel != "" {
		parsed, err := labels.Parse(sel)
		if err != nil {
			h.fail(w, &allocator.FieldError{Field: "selector", Value: sel, Limit: "is not a label selector (" + err.Error() + ")"})
			return
		}
		f.Selector = func(l map[string]string) bool { return parsed.Matches(labels.Set(l)) }
	}
	list := api.LeaseList{Leases: []api.Lease{}}
	for _, l := range h.s.Leases(f) {
		list.Leases = append(list.Leases, api.NewLease(l))
	}
	h.reply(w, http.StatusOK, list, nil)
}

func (h *handler) getLease(w http.ResponseWriter, r *http.Request) {
	if p, ok := h.principal(w, r); ok {
		l, err := h.s.Lease(p, r.PathValue("id"))
		h.reply(w, http.StatusOK, api.NewLease(l), err)
	}
}

func (h *handler) renew(w http.ResponseWriter, r *http.Request) {
	p, ok := h.principal(w, r)
	if !ok {
		return
	}
	var in api.RenewRequest
	if !decode(w, r, &in) {
		return
	}
	ttl, err := api.ParseDuration("ttl", in.TTL, 0)
	if err != nil {
		h.fail(w, err)
		return
	}
	l, err := h.s.Renew(r.Context(), p, r.PathValue("id"), ttl)
	h.reply(w, http.StatusOK, api.NewLease(l), err)
}

func (h *handler) release(w http.ResponseWriter, r *http.Request) {
	if p, ok := h.principal(w, r); ok {
		l, err := h.s.Release(r.Context(), p, r.PathValue("id"))
		h.reply(w, http.StatusOK, api.NewLease(l), err)
	}
}

func (h *handler) pool(w http.ResponseWriter, r *http.Request) {
	p, ok := h.principal(w, r)
	if !ok {
		return
	}
	st := h.s.Status()
	// Servers and shares are everyone's; who waits for them (pods, UIDs,
	// labels) is each namespace's own.
	if !p.Admin {
		st.Pending = slices.DeleteFunc(st.Pending, func(pr api.PendingRequest) bool { return !p.mayUse(pr.Namespace) })
	}
	h.reply(w, http.StatusOK, st, nil)
}

func (h *handler) quotas(w http.ResponseWriter, r *http.Request) {
	p, ok := h.principal(w, r)
	if !ok {
		return
	}
	out := []api.QuotaStatus{}
	for _, q := range h.s.Quotas() {
		if p.Admin || q.Namespace == p.Namespace {
			out = append(out, api.NewQuotaStatus(q))
		}
	}
	h.reply(w, http.StatusOK, api.QuotaList{Quotas: out}, nil)
}

// decode reads a JSON body, answering 400 itself when it cannot.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if extra := dec.Decode(&json.RawMessage{}); !errors.Is(extra, io.EOF) {
			err = errors.New("more than one JSON value (or trailing data) in the body")
		}
	}
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			api.WriteError(w, http.StatusRequestEntityTooLarge, &api.Error{Reason: api.ReasonRequestTooLarge, Message: fmt.Sprintf("body larger than %d bytes", maxBody)})
			return false
		}
		api.WriteError(w, http.StatusBadRequest, &api.Error{Reason: api.ReasonInvalid, Message: "body is not valid JSON for this request: " + err.Error()})
		return false
	}
	return true
}

func (h *handler) reply(w http.ResponseWriter, status int, v any, err error) {
	if err != nil {
		h.fail(w, err)
		return
	}
	if status == http.StatusNoContent {
		w.WriteHeader(status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// fail maps an error to its status and body; causes of 5xx are logged,
// not sent.
func (h *handler) fail(w http.ResponseWriter, err error) {
	var (
		field     *allocator.FieldError
		quota     *allocator.QuotaExceededError
		capacity  *allocator.NoCapacityError
		notFound  *allocator.LeaseNotFoundError
		noServer  *allocator.ServerNotFoundError
		conflict  *allocator.IdempotencyConflictError
		forbidden *ForbiddenError
	)
	e := &api.Error{Message: err.Error()}
	status := http.StatusInternalServerError
	switch {
	case errors.As(err, &field):
		status, e.Reason, e.Field, e.Value, e.Limit = http.StatusBadRequest, api.ReasonInvalid, field.Field, field.Value, field.Limit
	case errors.As(err, &forbidden):
		status, e.Reason = http.StatusForbidden, api.ReasonForbidden
	case errors.As(err, &quota):
		status, e.Reason = http.StatusForbidden, api.ReasonQuotaExceeded
	case errors.As(err, &notFound), errors.As(err, &noServer):
		status, e.Reason = http.StatusNotFound, api.ReasonNotFound
	case errors.As(err, &capacity):
		status, e.Reason = http.StatusConflict, api.ReasonNoCapacity
	case errors.As(err, &conflict):
		status, e.Reason = http.StatusConflict, api.ReasonConflict
	case errors.Is(err, errUnavailable):
		status, e.Reason = http.StatusServiceUnavailable, api.ReasonUnavailable
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// The client gave up (or its deadline passed) before the write was
		// durable: not a server fault; the change may still land.
		status, e.Reason, e.Message = http.StatusServiceUnavailable, api.ReasonUnavailable, "request canceled before it was durable; retry with the same idempotency key"
	default:
		h.log.Error("request failed", "err", err)
		e.Reason, e.Message = api.ReasonInternal, "internal error"
	}
	api.WriteError(w, status, e)
}

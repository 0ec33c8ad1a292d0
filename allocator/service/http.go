package service

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/console"
)

// maxBody bounds request bodies; a server with 64 GPUs fits well within.
// An acquisition may name every node of a large cluster as its candidate
// servers (allocator.MaxServers), hence its own bound: 100,000 names of 63
// characters, the usual longest, are 6.5 MB.
const (
	maxBody        = 1 << 20
	maxAcquireBody = 8 << 20
)

// Handler serves the /v1 API, the console's page, /metrics and /healthz.
// With auth nil every request acts as admin (for the embedded demo on
// loopback).
func Handler(s *Service, auth *Authenticator, gatherer prometheus.Gatherer, log *slog.Logger) http.Handler {
	h := &handler{s: s, auth: auth, log: log}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/servers/{name}", h.registerServer)
	mux.HandleFunc("GET /v1/servers/{name}", h.server)
	mux.HandleFunc("POST /v1/servers/{name}/heartbeat", h.heartbeat)
	mux.HandleFunc("POST /v1/leases", h.acquire)
	mux.HandleFunc("GET /v1/leases", h.listLeases)
	mux.HandleFunc("GET /v1/leases/{id}", h.getLease)
	mux.HandleFunc("POST /v1/leases/{id}/renew", h.renew)
	mux.HandleFunc("DELETE /v1/leases/{id}", h.release)
	mux.HandleFunc("GET /v1/pool", h.pool)
	mux.HandleFunc("GET /v1/quotas", h.quotas)
	mux.HandleFunc("GET /v1/console", h.console)
	mux.Handle("GET "+console.Path, console.Handler())
	mux.Handle("GET /console", http.RedirectHandler(console.Path, http.StatusMovedPermanently))
	mux.HandleFunc("PUT /v1/quotas/{namespace}", h.setQuota)
	mux.HandleFunc("DELETE /v1/quotas/{namespace}", h.deleteQuota)
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-s.Failed():
			http.Error(w, "failed: recovering its state from the store", http.StatusServiceUnavailable)
		default:
			_, _ = io.WriteString(w, "ok\n")
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { h.fail(w, noRoute(mux, w, r)) })
	return mux
}

// StandbyHandler serves a replica that does not lead: metrics and health,
// and 503 for the API so that clients try another replica.
func StandbyHandler(gatherer prometheus.Gatherer, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "standby\n") })
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { writeError(w, errStandby, log) })
	return mux
}

// noRoute is the error of a request no route serves: a method its path
// does not take (the Allow header then lists those it does), or a path the
// API does not serve at all. The API answers it in JSON rather than the
// mux's plain text.
func noRoute(mux *http.ServeMux, w http.ResponseWriter, r *http.Request) error {
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
		return &methodError{method: r.Method, path: r.URL.Path, allowed: allow}
	}
	return &noRouteError{path: r.URL.Path}
}

type handler struct {
	s    *Service
	auth *Authenticator
	log  *slog.Logger
	// consoleReads paces the console's reads, by token.
	consoleReads readLimits
}

// principal authenticates the request, answering 401 itself when it fails.
func (h *handler) principal(w http.ResponseWriter, r *http.Request) (Principal, bool) {
	if h.auth == nil {
		return Principal{Admin: true}, true
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if ok {
		if p, known := h.auth.Lookup(token); known {
			// A reader reads: every route that changes something is not a
			// GET, so it is refused here, before any route's own check.
			if p.Reader && r.Method != http.MethodGet && r.Method != http.MethodHead {
				h.fail(w, &ForbiddenError{ReadOnly: r.Method + " " + r.URL.Path})
				return Principal{}, false
			}
			return p, true
		}
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="gpupool"`)
	h.fail(w, errUnauthorized)
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
	if !h.decode(w, r, &srv) {
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
	if !h.decode(w, r, &hb) {
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
	if !h.decodeUpTo(w, r, &in, maxAcquireBody) {
		return
	}
	req, wait, err := in.Parse()
	if err == nil && !p.mayUse(req.Namespace) {
		err = &ForbiddenError{Namespace: req.Namespace}
	}
	if err != nil {
		h.s.metrics.acquired(start, err)
		h.fail(w, err)
		return
	}
	if wait > 0 {
		// A queued request outlives the server's write timeout by design.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + time.Minute))
	}
	acquire := h.s.Acquire
	if in.AnswerBeforeDurable {
		acquire = h.s.AcquireBeforeDurable
	}
	l, err := acquire(r.Context(), req, wait)
	h.reply(w, http.StatusCreated, api.NewLease(l), err)
}

func (h *handler) listLeases(w http.ResponseWriter, r *http.Request) {
	p, ok := h.principal(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	f := LeaseFilter{Namespace: q.Get("namespace"), Server: q.Get("server"), OwnerUID: q.Get("ownerUID")}
	switch {
	case p.seesAll():
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
	idleOnly := q.Get("idle") == "true"
	leases := h.s.Leases(f)
	idle := h.s.IdleVerdicts(leases)
	list := api.LeaseList{Leases: []api.Lease{}}
	for i, l := range leases {
		if idleOnly && idle[i] == nil {
			continue
		}
		wire := api.NewLease(l)
		wire.Idle = idle[i]
		list.Leases = append(list.Leases, wire)
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
	if !h.decode(w, r, &in) {
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
	if !p.seesAll() {
		st.Pending = slices.DeleteFunc(st.Pending, func(pr api.PendingRequest) bool { return !p.mayUse(pr.Namespace) })
	}
	h.reply(w, http.StatusOK, st, nil)
}

// console answers the console's view, scoped to the token as /v1/pool
// and /v1/leases are, from the bytes encoded once per build (ConsoleJSON).
// Past consoleReadsPerSecond reads of one token, the read is answered 429
// after a second: a client that retries at once still costs the allocator
// one request a second per connection, not all its CPU.
func (h *handler) console(w http.ResponseWriter, r *http.Request) {
	p, ok := h.principal(w, r)
	if !ok {
		return
	}
	// By the token authenticated: in the open mode (no --config) every
	// request is one caller, whatever header it forges.
	token := ""
	if h.auth != nil {
		token = r.Header.Get("Authorization")
	}
	if !h.consoleReads.allow(token) {
		select {
		case <-r.Context().Done():
			return
		case <-time.After(consoleRetryAfter):
		}
		w.Header().Set("Retry-After", strconv.Itoa(int(consoleRetryAfter/time.Second)))
		api.WriteError(w, http.StatusTooManyRequests, &api.Error{Reason: api.ReasonTooManyRequests,
			Message: fmt.Sprintf("this token read the console more than %d times a second, the most it may; the view changes once a second", consoleReadsPerSecond)})
		return
	}
	// A page polls this every second, and a large pool's view is
	// megabytes of JSON, a thirtieth of it compressed.
	gzipped := acceptsGzip(r.Header.Values("Accept-Encoding"))
	body := h.s.ConsoleJSON(p, gzipped)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Vary", "Accept-Encoding")
	if gzipped {
		w.Header().Set("Content-Encoding", "gzip")
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = w.Write(body)
}

// consoleReadsPerSecond bounds one token's console reads: a page reads
// once a second, and the view changes once a second, so ten pages open on
// one token read within it.
const consoleReadsPerSecond = 10

// consoleRetryAfter is how long a read past the bound waits for its 429.
const consoleRetryAfter = time.Second

// readLimits paces each token's console reads.
type readLimits struct {
	mu sync.Mutex
	by map[string]*rate.Limiter
}

// allow takes one of token's reads, if the pace leaves one.
func (l *readLimits) allow(token string) bool {
	l.mu.Lock()
	lim := l.by[token]
	if lim == nil {
		if l.by == nil {
			l.by = map[string]*rate.Limiter{}
		}
		// Authenticated tokens come from the allocator's configuration:
		// a bounded set.
		lim = rate.NewLimiter(consoleReadsPerSecond, consoleReadsPerSecond)
		l.by[token] = lim
	}
	l.mu.Unlock()
	return lim.Allow()
}

// acceptsGzip reads Accept-Encoding as RFC 9110 says: gzip (or *) with a
// q-value above 0; "gzip;q=0" refuses it.
func acceptsGzip(headers []string) bool {
	for _, h := range headers {
		for coding := range strings.SplitSeq(h, ",") {
			name, params, _ := strings.Cut(coding, ";")
			if name = strings.ToLower(strings.TrimSpace(name)); name != "gzip" && name != "x-gzip" && name != "*" {
				continue
			}
			q := 1.0
			for param := range strings.SplitSeq(params, ";") {
				if k, v, ok := strings.Cut(strings.TrimSpace(param), "="); ok && strings.EqualFold(k, "q") {
					if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
						q = f
					} else {
						q = 0
					}
				}
			}
			if q > 0 {
				return true
			}
		}
	}
	return false
}

// server answers one server of the pool, as GET /v1/pool shows it to
// every token.
func (h *handler) server(w http.ResponseWriter, r *http.Request) {
	if _, ok := h.principal(w, r); !ok {
		return
	}
	st, err := h.s.Server(r.PathValue("name"))
	h.reply(w, http.StatusOK, st, err)
}

func (h *handler) quotas(w http.ResponseWriter, r *http.Request) {
	p, ok := h.principal(w, r)
	if !ok {
		return
	}
	out := []api.QuotaStatus{}
	for _, q := range h.s.Quotas() {
		if p.seesAll() || q.Namespace == p.Namespace {
			out = append(out, api.NewQuotaStatus(q))
		}
	}
	h.reply(w, http.StatusOK, api.QuotaList{Quotas: out}, nil)
}

// setQuota sets a namespace's quota; only an admin may.
func (h *handler) setQuota(w http.ResponseWriter, r *http.Request) {
	if !h.adminPrincipal(w, r, "set quotas") {
		return
	}
	var in api.QuotaRequest
	if !h.decode(w, r, &in) {
		return
	}
	hard, err := quotaShare(in)
	var q allocator.QuotaStatus
	if err == nil {
		q, err = h.s.SetQuota(r.Context(), r.PathValue("namespace"), hard)
	}
	h.reply(w, http.StatusOK, api.NewQuotaStatus(q), err)
}

// deleteQuota leaves a namespace unlimited; only an admin may.
func (h *handler) deleteQuota(w http.ResponseWriter, r *http.Request) {
	if h.adminPrincipal(w, r, "remove quotas") {
		q, err := h.s.DeleteQuota(r.Context(), r.PathValue("namespace"))
		h.reply(w, http.StatusOK, api.NewQuotaStatus(q), err)
	}
}

// adminPrincipal authenticates an admin, answering 401 or 403 itself when
// the request is not one; operation says what was refused.
func (h *handler) adminPrincipal(w http.ResponseWriter, r *http.Request, operation string) bool {
	p, ok := h.principal(w, r)
	if ok && !p.Admin {
		h.fail(w, &ForbiddenError{AdminOnly: operation})
		return false
	}
	return ok
}

// decode reads a JSON body of at most maxBody bytes, answering 400 or 413
// itself when it cannot.
func (h *handler) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	return h.decodeUpTo(w, r, v, maxBody)
}

func (h *handler) decodeUpTo(w http.ResponseWriter, r *http.Request, v any, limit int64) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err == nil {
		err = decodeStrict(body, v)
	}
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		h.fail(w, &tooLargeError{limit: tooLarge.Limit})
	case err != nil:
		h.fail(w, &bodyError{err})
	}
	return err == nil
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

// fail answers a failed request as its kind says.
func (h *handler) fail(w http.ResponseWriter, err error) { writeError(w, err, h.log) }

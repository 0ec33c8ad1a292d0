package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
)

// errorKind is one class of failure and how the allocator reports it: the
// HTTP status (who must act), the API's reason, and the reason label of
// bitfusion_lease_acquisitions_total, for the kinds an acquisition can meet.
type errorKind struct {
	is     func(error) bool
	status int
	reason string
	label  string
	// waitable kinds end when share or quota frees up: an acquire that
	// may wait queues for them.
	waitable bool
	// message replaces the error's own text in the answer.
	message string
}

// errorKinds classifies every failure the API answers, the first match
// winning; what none matches is an internal error.
var errorKinds = []errorKind{
	// Before the refusals it wraps.
	{is: isA[*TooManyWaitingError], status: http.StatusTooManyRequests, reason: api.ReasonTooManyWaiting, label: "too_many_waiting"},
	{is: isA[*allocator.FieldError], status: http.StatusBadRequest, reason: api.ReasonInvalid, label: "invalid"},
	{is: isA[*bodyError], status: http.StatusBadRequest, reason: api.ReasonInvalid},
	{is: isA[*tooLargeError], status: http.StatusRequestEntityTooLarge, reason: api.ReasonRequestTooLarge},
	{is: is(errUnauthorized), status: http.StatusUnauthorized, reason: api.ReasonUnauthorized},
	{is: isA[*ForbiddenError], status: http.StatusForbidden, reason: api.ReasonForbidden, label: "forbidden"},
	{is: isA[*allocator.QuotaExceededError], status: http.StatusForbidden, reason: api.ReasonQuotaExceeded, label: "quota_exceeded", waitable: true},
	{is: isA[*allocator.LeaseNotFoundError], status: http.StatusNotFound, reason: api.ReasonNotFound},
	{is: isA[*allocator.ServerNotFoundError], status: http.StatusNotFound, reason: api.ReasonNotFound},
	{is: isA[*noRouteError], status: http.StatusNotFound, reason: api.ReasonNotFound},
	{is: isA[*methodError], status: http.StatusMethodNotAllowed, reason: api.ReasonMethodNotAllowed},
	{is: isA[*allocator.NoCapacityError], status: http.StatusConflict, reason: api.ReasonNoCapacity, label: "no_capacity", waitable: true},
	{is: isA[*allocator.IdempotencyConflictError], status: http.StatusConflict, reason: api.ReasonConflict, label: "conflict"},
	{is: is(errUnavailable, errStandby), status: http.StatusServiceUnavailable, reason: api.ReasonUnavailable, label: "unavailable"},
	// The client gave up (or its deadline passed) before the write was
	// durable: not a server fault; the change may still land.
	{is: is(context.Canceled, context.DeadlineExceeded), status: http.StatusServiceUnavailable, reason: api.ReasonUnavailable, label: "canceled",
		message: "request canceled before it was durable; retry with the same idempotency key"},
}

// TooManyWaitingError refuses to queue an acquisition that may wait: the
// bound Limit (the flag's name) of requests already waits, Waiting of
// them, in Namespace or, with no namespace, in all.
type TooManyWaitingError struct {
	Refusal   error // why it would have waited
	Namespace string
	Limit     string
	Waiting   int
}

func (e *TooManyWaitingError) Error() string {
	where := "the allocator has"
	if e.Namespace != "" {
		where = "namespace " + e.Namespace + " has"
	}
	return fmt.Sprintf("%v; not queued: %s %d requests waiting, the most that %s allows; retry later, or without waiting",
		e.Refusal, where, e.Waiting, e.Limit)
}

func (e *TooManyWaitingError) Unwrap() error { return e.Refusal }

// internalError is the kind of every error no other kind matches.
var internalError = errorKind{status: http.StatusInternalServerError, reason: api.ReasonInternal, label: "error", message: "internal error"}

func kindOf(err error) errorKind {
	for _, k := range errorKinds {
		if k.is(err) {
			return k
		}
	}
	return internalError
}

func isA[T error](err error) bool {
	var target T
	return errors.As(err, &target)
}

func is(targets ...error) func(error) bool {
	return func(err error) bool {
		for _, t := range targets {
			if errors.Is(err, t) {
				return true
			}
		}
		return false
	}
}

// writeError answers a failed request as its kind says. The cause of an
// internal error is logged, not sent.
func writeError(w http.ResponseWriter, err error, log *slog.Logger) {
	k := kindOf(err)
	e := &api.Error{Reason: k.reason, Message: err.Error()}
	if k.message != "" {
		e.Message = k.message
	}
	if k.status == http.StatusInternalServerError {
		log.Error("request failed", "err", err)
	}
	var field *allocator.FieldError
	if errors.As(err, &field) {
		e.Field, e.Value, e.Limit = field.Field, field.Value, field.Limit
	}
	api.WriteError(w, k.status, e)
}

var (
	// errUnavailable answers every operation once the store has failed or
	// this replica stopped leading.
	errUnavailable = errors.New("allocator unavailable: recovering its state from the store")
	// errStandby answers the API on a replica that does not lead, so that
	// clients try another.
	errStandby      = errors.New("this allocator replica is standing by; ask the leader")
	errUnauthorized = errors.New("missing or unknown bearer token")
)

// ForbiddenError refuses an operation on another namespace, as a GPU
// server the token may not speak for, or one only an admin may do.
type ForbiddenError struct {
	Namespace string
	Server    string
	// AdminOnly names the operation only an admin token may do.
	AdminOnly string
	// ReadOnly names the request a reader's token made: it may only read.
	ReadOnly string
}

func (e *ForbiddenError) Error() string {
	switch {
	case e.ReadOnly != "":
		return "a readers token may only read (GET), not " + e.ReadOnly
	case e.AdminOnly != "":
		return "only an admin token may " + e.AdminOnly
	case e.Server != "":
		return "this token may not act as server " + e.Server
	}
	return "this token may not act in namespace " + e.Namespace
}

// bodyError is a request body that is not one JSON value of the request's
// shape.
type bodyError struct{ err error }

func (e *bodyError) Error() string {
	return "body is not valid JSON for this request: " + e.err.Error()
}

func (e *bodyError) Unwrap() error { return e.err }

// tooLargeError is a request body over the limit.
type tooLargeError struct{ limit int64 }

func (e *tooLargeError) Error() string { return fmt.Sprintf("body larger than %d bytes", e.limit) }

// noRouteError is a path the API does not serve.
type noRouteError struct{ path string }

func (e *noRouteError) Error() string {
	return "no such path " + e.path + " (the API is under /v1, see docs/allocator.md)"
}

// methodError is a method a path does not take.
type methodError struct {
	method, path string
	allowed      []string
}

func (e *methodError) Error() string {
	return e.method + " is not allowed on " + e.path + "; allowed: " + strings.Join(e.allowed, ", ")
}

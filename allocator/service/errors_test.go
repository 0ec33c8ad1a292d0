package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
)

// TestErrorKinds: each failure, wrapped or not, is answered with the
// status, reason and message its kind gives, counted under its label, and
// only capacity and quota are waited for.
func TestErrorKinds(t *testing.T) {
	for _, tc := range []struct {
		err      error
		status   int
		reason   string
		label    string
		waitable bool
		message  string
	}{
		{&allocator.FieldError{Field: "gpu-percent", Value: "120", Limit: "out of range 1..100"}, 400, api.ReasonInvalid, "invalid", false, "gpu-percent 120 out of range 1..100"},
		{&bodyError{errors.New("unexpected EOF")}, 400, api.ReasonInvalid, "", false, "body is not valid JSON for this request: unexpected EOF"},
		{&tooLargeError{limit: maxBody}, 413, api.ReasonRequestTooLarge, "", false, "body larger than 1048576 bytes"},
		{errUnauthorized, 401, api.ReasonUnauthorized, "", false, "missing or unknown bearer token"},
		{&ForbiddenError{Namespace: "team-b"}, 403, api.ReasonForbidden, "forbidden", false, "this token may not act in namespace team-b"},
		{&allocator.QuotaExceededError{Namespace: "ml", Hard: allocator.WholeGPU, InUse: allocator.WholeGPU, Asked: 1}, 403, api.ReasonQuotaExceeded, "quota_exceeded", true, ""},
		{fmt.Errorf("renewing: %w", &allocator.LeaseNotFoundError{ID: "lease-000001"}), 404, api.ReasonNotFound, "", false, ""},
		{&allocator.ServerNotFoundError{Name: "gpu-9"}, 404, api.ReasonNotFound, "", false, "server gpu-9 not registered"},
		{&noRouteError{path: "/v2"}, 404, api.ReasonNotFound, "", false, ""},
		{&methodError{method: "PATCH", path: "/v1/pool", allowed: []string{"GET"}}, 405, api.ReasonMethodNotAllowed, "", false, "PATCH is not allowed on /v1/pool; allowed: GET"},
		{&allocator.NoCapacityError{GPUs: 4, PerGPU: allocator.WholeGPU}, 409, api.ReasonNoCapacity, "no_capacity", true, "no server has 4 free GPUs"},
		{&TooManyWaitingError{Refusal: &allocator.NoCapacityError{GPUs: 1, PerGPU: allocator.WholeGPU}, Limit: "max-waiting", Waiting: 1000}, 429, api.ReasonTooManyWaiting, "too_many_waiting", false,
			"no server has 1 free GPU; not queued: the allocator has 1000 requests waiting, the most that max-waiting allows; retry later, or without waiting"},
		{&allocator.IdempotencyConflictError{Key: "k", LeaseID: "lease-000001"}, 409, api.ReasonConflict, "conflict", false, ""},
		{errUnavailable, 503, api.ReasonUnavailable, "unavailable", false, "allocator unavailable: recovering its state from the store"},
		{errStandby, 503, api.ReasonUnavailable, "unavailable", false, "this allocator replica is standing by; ask the leader"},
		{fmt.Errorf("waiting: %w", context.Canceled), 503, api.ReasonUnavailable, "canceled", false, "request canceled before it was durable; retry with the same idempotency key"},
		{errors.New("disk on fire"), 500, api.ReasonInternal, "error", false, "internal error"},
	} {
		k := kindOf(tc.err)
		if k.status != tc.status || k.reason != tc.reason || k.label != tc.label || k.waitable != tc.waitable {
			t.Errorf("%T %v: kind %d %s %q waitable %v; want %d %s %q waitable %v",
				tc.err, tc.err, k.status, k.reason, k.label, k.waitable, tc.status, tc.reason, tc.label, tc.waitable)
		}
		rec := httptest.NewRecorder()
		writeError(rec, tc.err, slog.New(slog.NewTextHandler(io.Discard, nil)))
		var body api.Error
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("%v: body %q: %v", tc.err, rec.Body, err)
		}
		want := tc.message
		if want == "" {
			want = tc.err.Error()
		}
		if rec.Code != tc.status || body.Reason != tc.reason || body.Message != want {
			t.Errorf("%v answered %d %+v; want %d %s %q", tc.err, rec.Code, body, tc.status, tc.reason, want)
		}
	}
}

// TestFieldErrorsNameTheirParts: an Invalid answer repeats the field, the
// value and the limit.
func TestFieldErrorsNameTheirParts(t *testing.T) {
	rec := httptest.NewRecorder()
	writeError(rec, fmt.Errorf("parsing: %w", &allocator.FieldError{Field: "ttl", Value: "1ns", Limit: "is shorter than 1s"}), nil)
	var body api.Error
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if body.Field != "ttl" || body.Value != "1ns" || body.Limit != "is shorter than 1s" {
		t.Errorf("Invalid answer %+v does not name the field, value and limit", body)
	}
}

// TestStandbyAnswersUnavailable: a replica that does not lead answers the
// API 503 Unavailable, as a failed store does, so that clients try the
// next replica, and serves its health and metrics.
func TestStandbyAnswersUnavailable(t *testing.T) {
	srv := httptest.NewServer(StandbyHandler(prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil))))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/leases", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body api.Error
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || body.Reason != api.ReasonUnavailable || !strings.Contains(body.Message, "standing by") {
		t.Errorf("standby answered %d %+v", resp.StatusCode, body)
	}
	health, err := http.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer health.Body.Close()
	if text, _ := io.ReadAll(health.Body); health.StatusCode != http.StatusOK || string(text) != "standby\n" {
		t.Errorf("standby health: %d %q", health.StatusCode, text)
	}
}

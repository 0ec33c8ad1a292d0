package client

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator/api"
)

// TestUnreachableNamesEveryEndpoint: when no replica answers, the error
// says so as an *UnreachableError naming them all and the cause, and the
// cause stays reachable with errors.Is.
func TestUnreachableNamesEveryEndpoint(t *testing.T) {
	var closed []string // addresses where nothing listens
	for range 2 {
		srv := httptest.NewServer(http.NotFoundHandler())
		srv.Close()
		closed = append(closed, srv.URL)
	}
	a, b := closed[0], closed[1]
	c, err := New([]string{a + "," + b}, "")
	if err != nil {
		t.Fatal(err)
	}
	c.Retries, c.Backoff = 4, time.Millisecond
	_, err = c.Leases(context.Background(), LeaseFilter{})
	var u *UnreachableError
	if !errors.As(err, &u) {
		t.Fatalf("error %v (%T), want an *UnreachableError", err, err)
	}
	if want := "cannot reach the allocator at " + a + "," + b + ": "; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("message %q, want it to start with %q", err, want)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("error %v does not wrap the refused connection", err)
	}
	if strings.Contains(err.Error(), "/v1/") {
		t.Errorf("message %q repeats the request's URL", err)
	}
}

// TestAnswersAreNotUnreachable: an allocator that answers with an error,
// even 503, was reached.
func TestAnswersAreNotUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		api.WriteError(w, http.StatusServiceUnavailable, &api.Error{Reason: api.ReasonUnavailable, Message: "not the leader"})
	}))
	defer srv.Close()
	c, err := New([]string{srv.URL}, "")
	if err != nil {
		t.Fatal(err)
	}
	c.Retries, c.Backoff = 2, time.Millisecond
	_, err = c.Pool(context.Background())
	var u *UnreachableError
	if errors.As(err, &u) || !IsReason(err, api.ReasonUnavailable) {
		t.Errorf("error %v, want the allocator's Unavailable answer", err)
	}
}

// TestConsoleReadsAgainPastThePace: a read answered 429 TooManyRequests
// (the allocator waited the second already) is read again; any other
// refusal is returned.
func TestConsoleReadsAgainPastThePace(t *testing.T) {
	var mu sync.Mutex
	reads := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch reads++; reads {
		case 1, 2:
			api.WriteError(w, http.StatusTooManyRequests, &api.Error{Reason: api.ReasonTooManyRequests, Message: "too many"})
		case 3:
			_, _ = io.WriteString(w, `{"policy":"fgd-cpu"}`)
		default:
			api.WriteError(w, http.StatusUnauthorized, &api.Error{Reason: api.ReasonUnauthorized, Message: "no"})
		}
	}))
	defer srv.Close()
	c, err := New([]string{srv.URL}, "")
	if err != nil {
		t.Fatal(err)
	}
	if v, err := c.Console(context.Background()); err != nil || v.Policy != "fgd-cpu" || reads != 3 {
		t.Errorf("Console = %+v, %v after %d reads; want the third read's view", v, err, reads)
	}
	if _, err := c.Console(context.Background()); !IsReason(err, api.ReasonUnauthorized) {
		t.Errorf("Console = %v; want the Unauthorized answer", err)
	}
}

// TestLeasesQuery: a filter goes in the query; no filter sends no query.
func TestLeasesQuery(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.URL.RequestURI())
		_, _ = w.Write([]byte(`{"leases":[]}`))
	}))
	defer srv.Close()
	c, err := New([]string{srv.URL}, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []LeaseFilter{{}, {Namespace: "ml", Selector: "app=tf-training"}, {OwnerUID: "3f2c-uid"}} {
		if _, err := c.Leases(context.Background(), f); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"/v1/leases", "/v1/leases?namespace=ml&selector=app%3Dtf-training", "/v1/leases?ownerUID=3f2c-uid"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("requests %q, want %q", got, want)
	}
}

// TestQuotaRequests: SetQuota sends the share in percent of one GPU to
// the namespace's path, DeleteQuota deletes that path.
func TestQuotaRequests(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got = append(got, r.Method+" "+r.URL.Path+" "+string(body))
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	c, err := New([]string{srv.URL}, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetQuota(context.Background(), "team-a", 1466); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteQuota(context.Background(), "team-a"); err != nil {
		t.Fatal(err)
	}
	want := []string{`PUT /v1/quotas/team-a {"hardPercent":146.6}`, "DELETE /v1/quotas/team-a "}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests %q, want %q", got, want)
	}
}

// TestBurstsReuseConnections: the connections a burst of concurrent calls
// opens stay open for the next burst, which opens none.
func TestBurstsReuseConnections(t *testing.T) {
	const burst = 8
	var arrived sync.WaitGroup
	var mu sync.Mutex
	opened := 0
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		// Every call of the burst is in flight at once, each on a
		// connection of its own.
		arrived.Done()
		arrived.Wait()
		_, _ = io.WriteString(w, `{"quotas":[]}`)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			opened++
			mu.Unlock()
		}
	}
	srv.Start()
	defer srv.Close()
	c, err := New([]string{srv.URL}, "")
	if err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		arrived.Add(burst)
		var calls sync.WaitGroup
		for range burst {
			calls.Go(func() {
				if _, err := c.Quotas(context.Background()); err != nil {
					t.Error(err)
				}
			})
		}
		calls.Wait()
		mu.Lock()
		if opened != burst {
			t.Errorf("after burst %d of %d calls, %d connections opened in all, want %d", round+1, burst, opened, burst)
		}
		mu.Unlock()
	}
}

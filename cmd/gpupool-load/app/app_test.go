package app

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/cli"
)

// TestRunSumsUpFailedCalls: against an allocator that does not answer,
// the load runs its duration, prints the summary with the failed calls,
// writes it to --summary-json and fails as reported.
func TestRunSumsUpFailedCalls(t *testing.T) {
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	o := NewOptions()
	o.Allocator, o.Servers, o.Leases, o.Duration = closed.URL, 2, 3, time.Second
	o.SummaryJSON = filepath.Join(t.TempDir(), "summary.json")
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	if err := Run(t.Context(), o, &stdout); !errors.Is(err, cli.ErrReported) {
		t.Errorf("Run: %v, want %v", err, cli.ErrReported)
	}
	out := stdout.String()
	if !strings.HasPrefix(out, "gpupool-load: 2 servers (16 GPUs), 3 leases of 10% in 1 namespaces, for 1s against "+closed.URL+"\n") ||
		!strings.Contains(out, "\nsummary after ") || !strings.Contains(out, "  registered servers   0\n") || !regexp.MustCompile(`\n  errors .*register unreachable: 2  \n`).MatchString(out) {
		t.Errorf("stdout:\n%s", out)
	}
	b, err := os.ReadFile(o.SummaryJSON)
	if err != nil {
		t.Fatal(err)
	}
	var s summary
	if err := json.Unmarshal(b, &s); err != nil || s.Servers != 2 || s.Leases != 3 || s.Errors["register unreachable"] != 2 {
		t.Errorf("--summary-json: %v\n%s", err, b)
	}
}

func TestQuantiles(t *testing.T) {
	var l latencies
	for i := range 100 {
		l.add(time.Duration(100-i) * time.Millisecond)
	}
	q := l.quantiles()
	if q.Count != 100 || q.P50 != 50*time.Millisecond || q.P99 != 99*time.Millisecond || q.Max != 100*time.Millisecond {
		t.Errorf("quantiles of 1..100 ms: %+v", q)
	}
}

// TestErrorKinds: failures are counted by the API's reason, or by what
// kept the call from an answer.
func TestErrorKinds(t *testing.T) {
	var e errorCounts
	e.add("acquire", &api.Error{Reason: api.ReasonNoCapacity})
	e.add("acquire", &api.Error{Reason: api.ReasonNoCapacity})
	e.add("renew", &client.UnreachableError{Err: os.ErrDeadlineExceeded})
	e.add("adapter", kindError("no value"))
	if got := fmt.Sprint(e.snapshot()); got != fmt.Sprintf("map[acquire %s:2 adapter no value:1 renew unreachable:1]", api.ReasonNoCapacity) {
		t.Errorf("errors by kind: %s", got)
	}
}

// TestSampleProcess reads this process's CPU time and resident memory.
func TestSampleProcess(t *testing.T) {
	s, err := sampleProcess(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s.rss <= 0 || s.cpu < 0 {
		t.Errorf("sample of this process: %+v", s)
	}
	if _, err := sampleProcess(1 << 30); err == nil {
		t.Error("a process that does not exist was sampled")
	}
}

package app

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/procstat"
)

// latencies records the durations of one kind of call.
type latencies struct {
	mu      sync.Mutex
	samples []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.samples = append(l.samples, d)
	l.mu.Unlock()
}

// Quantiles is the summary of one kind of call.
type Quantiles struct {
	Count int           `json:"count"`
	P50   time.Duration `json:"p50"`
	P99   time.Duration `json:"p99"`
	Max   time.Duration `json:"max"`
}

func (l *latencies) quantiles() Quantiles {
	l.mu.Lock()
	s := slices.Clone(l.samples)
	l.mu.Unlock()
	if len(s) == 0 {
		return Quantiles{}
	}
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[int(q*float64(len(s)-1))] }
	return Quantiles{Count: len(s), P50: at(0.50), P99: at(0.99), Max: s[len(s)-1]}
}

func (q Quantiles) String() string {
	if q.Count == 0 {
		return "none"
	}
	return fmt.Sprintf("p50 %v  p99 %v  max %v  (%d calls)", q.P50.Round(10*time.Microsecond), q.P99.Round(10*time.Microsecond), q.Max.Round(10*time.Microsecond), q.Count)
}

// errorCounts counts failed calls by operation and kind.
type errorCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (e *errorCounts) add(op string, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n = map[string]int{}
	}
	e.n[op+" "+errorKind(err)]++
}

func (e *errorCounts) snapshot() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.n)
}

func (e *errorCounts) total() int {
	n := 0
	for _, c := range e.snapshot() {
		n += c
	}
	return n
}

// errorKind is the API's reason for a refusal, or what kept the call from
// an answer.
func errorKind(err error) string {
	var apiErr *api.Error
	var unreachable *client.UnreachableError
	var kind kindError
	switch {
	case errors.As(err, &kind):
		return string(kind)
	case errors.As(err, &apiErr):
		return apiErr.Reason
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.As(err, &unreachable):
		return "unreachable"
	}
	return "other"
}

// processSample is a process's CPU time and resident memory at one moment.
type processSample struct {
	at  time.Time
	cpu time.Duration
	rss int64
}

// sampleProcess reads the process's CPU time and resident memory.
func sampleProcess(pid int) (processSample, error) {
	at := time.Now()
	u, err := procstat.Read(pid)
	if err != nil {
		return processSample{}, err
	}
	return processSample{at: at, cpu: u.CPU, rss: u.RSS}, nil
}

// cpuPerSecond is the CPU seconds the process used per second of wall
// time between two samples.
func cpuPerSecond(from, to processSample) float64 {
	wall := to.at.Sub(from.at)
	if wall <= 0 {
		return 0
	}
	return (to.cpu - from.cpu).Seconds() / wall.Seconds()
}

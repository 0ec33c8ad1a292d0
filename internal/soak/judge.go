// Package soak judges a soak run of the pool's processes: their resident
// memory and goroutines sampled over time must stay flat, under a limit
// per process kind, and the allocator's memory may grow only with the
// leases it holds. It writes the samples as CSV and draws them as a PNG.
// test/e2e's TestSoak runs the processes and samples them.
package soak

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Sample is one process's reading at one time.
type Sample struct {
	// At is the time since the soak started.
	At time.Duration
	// Process names the process: allocator, adapter, or a GPU server's
	// name, one series across the daemon's restarts.
	Process  string
	PID      int
	RSSBytes int64
	// AnonBytes is the part of RSSBytes that is no file's pages: the
	// process's heap and stacks, without its binary's.
	AnonBytes  int64
	Goroutines int
	// LiveLeases is how many leases the pool held at the time.
	LiveLeases int
}

// Goals are what a soak must meet.
type Goals struct {
	// Baseline is the start of the run whose samples set each process's
	// range; no later sample may leave it by more than the tolerance.
	Baseline time.Duration
	// Tolerance is the part of the baseline's highest value a later
	// sample may exceed it by; goroutines get at least GoroutineSlack,
	// so that a few connections in flight do not count as a leak.
	Tolerance      float64
	GoroutineSlack int
	// MaxRSS is the limit on each sample's resident memory, by process;
	// a process missing from it has none.
	MaxRSS map[string]int64
	// GrowsWithLeases names the process whose memory may grow past its
	// baseline in proportion to the live leases: the allocator's state.
	GrowsWithLeases string
}

// Verdict is one process's judgement.
type Verdict struct {
	Process string
	// The baseline's range and the highest value after it.
	BaselineRSS, BaselineGoroutines [2]int64
	PeakRSS, PeakGoroutines         int64
	// PeakRSSLeases is the live leases at the peak after the baseline.
	PeakRSSLeases int
	// PeakAnon is the highest AnonBytes of the run, which says how much
	// of a limit missed is the binary's pages.
	PeakAnon int64
	Samples  int
	// Missed says which goals were missed; empty when all were met.
	Missed []string
}

// Judge gives each process's verdict, in the order processes first
// appear in samples. Memory only growing counts: a sample under the
// baseline's range is memory returned to the system, not a leak.
func Judge(samples []Sample, g Goals) []Verdict {
	processes, series := byProcess(samples)
	verdicts := make([]Verdict, 0, len(processes))
	for _, p := range processes {
		verdicts = append(verdicts, judgeProcess(p, series[p], g))
	}
	return verdicts
}

// byProcess splits samples into each process's series, and names the
// processes in the order they first appear.
func byProcess(samples []Sample) (processes []string, series map[string][]Sample) {
	series = map[string][]Sample{}
	for _, s := range samples {
		if _, seen := series[s.Process]; !seen {
			processes = append(processes, s.Process)
		}
		series[s.Process] = append(series[s.Process], s)
	}
	return processes, series
}

func judgeProcess(process string, samples []Sample, g Goals) Verdict {
	v := Verdict{Process: process, Samples: len(samples),
		PeakAnon: slices.MaxFunc(samples, func(a, b Sample) int { return cmp.Compare(a.AnonBytes, b.AnonBytes) }).AnonBytes}
	var base, after []Sample
	for _, s := range samples {
		if s.At <= g.Baseline {
			base = append(base, s)
		} else {
			after = append(after, s)
		}
	}
	if limit, ok := g.MaxRSS[process]; ok {
		if peak := slices.MaxFunc(samples, byRSS); peak.RSSBytes >= limit {
			v.Missed = append(v.Missed, fmt.Sprintf("RSS %s at %s, limit %s", mib(peak.RSSBytes), minutes(peak.At), mib(limit)))
		}
	}
	if len(base) == 0 || len(after) == 0 {
		v.Missed = append(v.Missed, fmt.Sprintf("%d samples in the baseline and %d after it: nothing to judge flatness by", len(base), len(after)))
		return v
	}
	v.BaselineRSS = [2]int64{slices.MinFunc(base, byRSS).RSSBytes, slices.MaxFunc(base, byRSS).RSSBytes}
	v.BaselineGoroutines = [2]int64{int64(slices.MinFunc(base, byGoroutines).Goroutines), int64(slices.MaxFunc(base, byGoroutines).Goroutines)}
	peak := slices.MaxFunc(after, byRSS)
	v.PeakRSS, v.PeakRSSLeases = peak.RSSBytes, peak.LiveLeases
	baseLeases := slices.MaxFunc(base, byLeases).LiveLeases
	for _, s := range after {
		allowed := float64(v.BaselineRSS[1]) * (1 + g.Tolerance)
		if process == g.GrowsWithLeases && s.LiveLeases > baseLeases && baseLeases > 0 {
			allowed *= float64(s.LiveLeases) / float64(baseLeases)
		}
		if float64(s.RSSBytes) > allowed {
			v.Missed = append(v.Missed, fmt.Sprintf("RSS %s at %s (%d live leases), over the baseline's %s and %d live leases by more than %.0f%%",
				mib(s.RSSBytes), minutes(s.At), s.LiveLeases, mib(v.BaselineRSS[1]), baseLeases, 100*g.Tolerance))
			break
		}
	}
	v.PeakGoroutines = int64(slices.MaxFunc(after, byGoroutines).Goroutines)
	slack := max(int64(float64(v.BaselineGoroutines[1])*g.Tolerance), int64(g.GoroutineSlack))
	if v.PeakGoroutines > v.BaselineGoroutines[1]+slack {
		v.Missed = append(v.Missed, fmt.Sprintf("%d goroutines, over the baseline's %d by more than %d", v.PeakGoroutines, v.BaselineGoroutines[1], slack))
	}
	return v
}

func byRSS(a, b Sample) int        { return cmp.Compare(a.RSSBytes, b.RSSBytes) }
func byGoroutines(a, b Sample) int { return cmp.Compare(a.Goroutines, b.Goroutines) }
func byLeases(a, b Sample) int     { return cmp.Compare(a.LiveLeases, b.LiveLeases) }

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func minutes(d time.Duration) string { return fmt.Sprintf("%.1f min", d.Minutes()) }

// WriteReport writes the verdicts as a Markdown table, one row a process.
func WriteReport(w io.Writer, verdicts []Verdict) error {
	if _, err := fmt.Fprintln(w, "| process | samples | baseline RSS | peak RSS after (live leases) | peak RssAnon | baseline goroutines | peak goroutines after | verdict |\n|---|---|---|---|---|---|---|---|"); err != nil {
		return err
	}
	for _, v := range verdicts {
		verdict := "met"
		if len(v.Missed) > 0 {
			verdict = "MISSED: " + strings.Join(v.Missed, "; ")
		}
		if _, err := fmt.Fprintf(w, "| %s | %d | %s - %s | %s (%d) | %s | %d - %d | %d | %s |\n", v.Process, v.Samples,
			mib(v.BaselineRSS[0]), mib(v.BaselineRSS[1]), mib(v.PeakRSS), v.PeakRSSLeases, mib(v.PeakAnon),
			v.BaselineGoroutines[0], v.BaselineGoroutines[1], v.PeakGoroutines, verdict); err != nil {
			return err
		}
	}
	return nil
}

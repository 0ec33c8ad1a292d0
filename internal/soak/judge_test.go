package soak

import (
	"strings"
	"testing"
	"time"
)

const mb = 1 << 20

var goals = Goals{Baseline: 10 * time.Minute, Tolerance: 0.1, GoroutineSlack: 5,
	MaxRSS: map[string]int64{"sim-0": 30 * mb}, GrowsWithLeases: "allocator"}

// series is a process's samples, one a minute from minute 1: rss in MiB,
// goroutines and live leases of each.
func series(process string, rss []int64, goroutines, leases []int) []Sample {
	var out []Sample
	for i := range rss {
		out = append(out, Sample{At: time.Duration(i+1) * time.Minute, Process: process, PID: 100,
			RSSBytes: rss[i] * mb, AnonBytes: rss[i] * mb / 2, Goroutines: goroutines[i], LiveLeases: leases[i]})
	}
	return out
}

// repeat is n copies of v.
func repeat[T any](v T, n int) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func TestJudge(t *testing.T) {
	flat := repeat[int64](20, 15)
	for _, tc := range []struct {
		name    string
		samples []Sample
		missed  string // a part of the one goal missed; empty: all met
	}{
		{"flat", series("sim-0", flat, repeat(12, 15), repeat(5, 15)), ""},
		{"within the tolerance", series("sim-0", append(repeat[int64](20, 10), 21, 21, 22, 22, 22), repeat(12, 15), repeat(5, 15)), ""},
		{"falling is no leak", series("sim-0", append(repeat[int64](20, 10), 15, 12, 10, 10, 10), repeat(12, 15), repeat(5, 15)), ""},
		{"RSS grows", series("sim-0", append(repeat[int64](20, 10), 21, 22, 23, 24, 25), repeat(12, 15), repeat(5, 15)),
			"RSS 23.0 MiB at 13.0 min (5 live leases), over the baseline's 20.0 MiB"},
		{"over the limit", series("sim-0", repeat[int64](31, 15), repeat(12, 15), repeat(5, 15)), "RSS 31.0 MiB at 1.0 min, limit 30.0 MiB"},
		{"goroutines grow", series("sim-0", flat, append(repeat(12, 10), 14, 16, 18, 20, 22), repeat(5, 15)),
			"22 goroutines, over the baseline's 12 by more than 5"},
		{"the allocator grows with its leases", series("allocator", append(repeat[int64](20, 10), 30, 40, 40, 40, 40), repeat(12, 15),
			append(repeat(5, 10), 8, 10, 10, 10, 10)), ""},
		{"the allocator grows past its leases", series("allocator", append(repeat[int64](20, 10), 30, 40, 40, 40, 40), repeat(12, 15),
			append(repeat(5, 10), 5, 10, 10, 10, 10)), "RSS 30.0 MiB at 11.0 min (5 live leases)"},
		{"another process may not grow with the leases", series("adapter", append(repeat[int64](20, 10), 30, 40, 40, 40, 40), repeat(12, 15),
			append(repeat(5, 10), 8, 10, 10, 10, 10)), "RSS 30.0 MiB at 11.0 min (8 live leases)"},
		{"nothing after the baseline", series("sim-0", repeat[int64](20, 10), repeat(12, 10), repeat(5, 10)), "10 samples in the baseline and 0 after it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := Judge(tc.samples, goals)
			if len(v) != 1 {
				t.Fatalf("%d verdicts for one process", len(v))
			}
			switch {
			case tc.missed == "" && len(v[0].Missed) > 0:
				t.Errorf("missed %q, want every goal met", v[0].Missed)
			case tc.missed != "" && (len(v[0].Missed) != 1 || !strings.Contains(v[0].Missed[0], tc.missed)):
				t.Errorf("missed %q, want one goal missed: %q", v[0].Missed, tc.missed)
			}
		})
	}
}

func TestJudgeKeepsEachProcessApart(t *testing.T) {
	samples := append(series("allocator", repeat[int64](40, 15), repeat(30, 15), repeat(5, 15)),
		series("sim-0", repeat[int64](20, 15), repeat(12, 15), repeat(5, 15))...)
	v := Judge(samples, goals)
	if len(v) != 2 || v[0].Process != "allocator" || v[1].Process != "sim-0" {
		t.Fatalf("verdicts %+v, want the allocator's then sim-0's", v)
	}
	if v[1].BaselineRSS != [2]int64{20 * mb, 20 * mb} || v[1].PeakGoroutines != 12 || len(v[1].Missed) > 0 {
		t.Errorf("sim-0's verdict %+v, judged with the allocator's samples", v[1])
	}
}

func TestWriteReport(t *testing.T) {
	samples := append(series("allocator", repeat[int64](40, 15), repeat(30, 15), repeat(5, 15)),
		series("sim-0", repeat[int64](31, 15), repeat(12, 15), repeat(5, 15))...)
	var b strings.Builder
	if err := WriteReport(&b, Judge(samples, goals)); err != nil {
		t.Fatal(err)
	}
	want := `| process | samples | baseline RSS | peak RSS after (live leases) | peak RssAnon | baseline goroutines | peak goroutines after | verdict |
|---|---|---|---|---|---|---|---|
| allocator | 15 | 40.0 MiB - 40.0 MiB | 40.0 MiB (5) | 20.0 MiB | 30 - 30 | 30 | met |
| sim-0 | 15 | 31.0 MiB - 31.0 MiB | 31.0 MiB (5) | 15.5 MiB | 12 - 12 | 12 | MISSED: RSS 31.0 MiB at 1.0 min, limit 30.0 MiB |
`
	if b.String() != want {
		t.Errorf("report:\n%s\nwant:\n%s", b.String(), want)
	}
}

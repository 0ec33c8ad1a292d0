package soak

import (
	"encoding/csv"
	"io"
	"strconv"
)

// WriteCSV writes the samples, one row each, under a header.
func WriteCSV(w io.Writer, samples []Sample) error {
	out := csv.NewWriter(w)
	if err := out.Write([]string{"seconds", "process", "pid", "rss_bytes", "rss_anon_bytes", "goroutines", "live_leases"}); err != nil {
		return err
	}
	for _, s := range samples {
		if err := out.Write([]string{strconv.FormatFloat(s.At.Seconds(), 'f', 0, 64), s.Process, strconv.Itoa(s.PID),
			strconv.FormatInt(s.RSSBytes, 10), strconv.FormatInt(s.AnonBytes, 10), strconv.Itoa(s.Goroutines), strconv.Itoa(s.LiveLeases)}); err != nil {
			return err
		}
	}
	out.Flush()
	return out.Error()
}

package soak

import (
	"os"
	"strings"
	"testing"
)

func TestStatusKB(t *testing.T) {
	status := []byte("Name:\tgpupool-server\nVmPeak:\t 1265556 kB\nVmRSS:\t   21504 kB\nRssAnon:\t    9000 kB\n")
	if got, err := statusKB(status, "VmRSS"); err != nil || got != 21504<<10 {
		t.Errorf("VmRSS = %d, %v; want %d", got, err, 21504<<10)
	}
	if got, err := statusKB(status, "RssAnon"); err != nil || got != 9000<<10 {
		t.Errorf("RssAnon = %d, %v; want %d", got, err, 9000<<10)
	}
	// A zombie's status has no VmRSS.
	if _, err := statusKB([]byte("Name:\tgpupool-server\nState:\tZ (zombie)\n"), "VmRSS"); err == nil {
		t.Error("no error without VmRSS")
	}
}

func TestReadRSSOfThisProcess(t *testing.T) {
	rss, anon, err := ReadRSS(os.Getpid())
	if err != nil || anon <= 0 || rss < anon {
		t.Errorf("ReadRSS(self) = %d, %d, %v; want 0 < RssAnon <= VmRSS", rss, anon, err)
	}
}

func TestGoroutines(t *testing.T) {
	metrics := "# HELP go_goroutines Number of goroutines that currently exist.\n# TYPE go_goroutines gauge\ngo_goroutines 42\n" +
		"# TYPE go_threads gauge\ngo_threads 9\n"
	if got, err := Goroutines(strings.NewReader(metrics)); err != nil || got != 42 {
		t.Errorf("Goroutines = %d, %v; want 42", got, err)
	}
	if _, err := Goroutines(strings.NewReader("# TYPE go_threads gauge\ngo_threads 9\n")); err == nil {
		t.Error("no error without go_goroutines")
	}
}

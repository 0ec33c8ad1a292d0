package soak

import (
	"strings"
	"testing"
)

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

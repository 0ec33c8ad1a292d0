// Package logtest captures what a service logs, for tests that wait for
// one of its lines (the address it serves on, that it is ready).
package logtest

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// Log is a text logger's output.
type Log struct {
	mu  sync.Mutex
	out strings.Builder
}

// Logger returns a logger, at debug level, that writes to l.
func (l *Log) Logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.out.Write(p)
}

// String is everything logged so far.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.out.String()
}

// Await returns the first line logged that holds msg, waiting up to 10 s
// for it; done, once closed, ends the wait early (the service returned).
// It fails the test, with the log, if no such line comes.
func (l *Log) Await(t testing.TB, msg string, done <-chan struct{}) string {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		for line := range strings.Lines(l.String()) {
			if strings.Contains(line, msg) {
				return strings.TrimSuffix(line, "\n")
			}
		}
		select {
		case <-done:
			t.Fatalf("%q never logged; the service returned:\n%s", msg, l)
		case <-deadline:
			t.Fatalf("%q not logged within 10 s:\n%s", msg, l)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Value is the value of key=value in a line, "" when the line has none.
func Value(line, key string) string {
	for field := range strings.FieldsSeq(line) {
		if v, ok := strings.CutPrefix(field, key+"="); ok {
			return v
		}
	}
	return ""
}

// Package golden keeps a test's expected output in a file: the test
// compares what the code does with it, and -update rewrites it, so that a
// change that is meant shows as a diff to review.
package golden

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files from what the code does now (read the diff!)")

// Updating is whether this run rewrites the golden files (-update).
func Updating() bool { return *update }

// Check compares got with the file at path, and fails t when they differ;
// with -update it first writes got there.
func Check(t testing.TB, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (write it with -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (if the change is meant, rewrite it with -update and read the diff); got:\n%s", path, got)
	}
}

package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestClientCommand: the "try" line names the gpupool binary built next to
// the demo, relative to the working directory when under it, and go run
// when there is none.
func TestClientCommand(t *testing.T) {
	root := t.TempDir()
	bin := filepath.Join(root, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	self := filepath.Join(bin, "gpupool-demo")
	if got := clientCommand(self, root); got != "go run ./cmd/gpupool" {
		t.Errorf("no gpupool beside the demo: %q, want go run", got)
	}
	if err := os.WriteFile(filepath.Join(bin, "gpupool"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ wd, want string }{
		{root, "./bin/gpupool"},
		{bin, "./gpupool"}, // not a bare name, which a shell would look up in PATH
		{t.TempDir(), filepath.Join(bin, "gpupool")},
	} {
		if got := clientCommand(self, tc.wd); got != tc.want {
			t.Errorf("from %s: %q, want %q", tc.wd, got, tc.want)
		}
	}
}

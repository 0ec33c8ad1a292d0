package main

import (
	"bufio"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// heldBy lists which of paths this process holds open, by the files'
// identity, as the daemon finds them.
func heldBy(t *testing.T, paths ...string) []string {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd to look in:", err)
	}
	var held []string
	for _, p := range paths {
		want, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, fd := range fds {
			if st, err := os.Stat(filepath.Join("/proc/self/fd", fd.Name())); err == nil && os.SameFile(st, want) {
				held = append(held, filepath.Base(p))
				break
			}
		}
	}
	return held
}

// TestHoldsTheGPUsItWasGiven: gpuload prints its environment sorted, one
// variable a line, holds open the device files of the GPUs
// GPUPOOL_GPU_UUIDS names and no other, and when told to stop, closes them
// and ends with 0.
func TestHoldsTheGPUsItWasGiven(t *testing.T) {
	dir := t.TempDir()
	var paths []string
	for _, uuid := range []string{"GPU-a", "GPU-b", "GPU-c"} {
		p := filepath.Join(dir, uuid)
		if err := os.WriteFile(p, nil, 0o444); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	env := []string{"PATH=/bin", "GPUPOOL_LEASE_ID=lease-000001", "GPUPOOL_GPU_UUIDS=GPU-a,GPU-c"}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var stdout strings.Builder
	stderr, logged := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--device-dir", dir}, env, &stdout, logged)
		_ = logged.Close()
	}()
	lines := bufio.NewScanner(stderr)
	for _, want := range []string{"GPU-a", "GPU-c"} {
		if !lines.Scan() || lines.Text() != "gpuload: holding "+filepath.Join(dir, want) {
			t.Fatalf("stderr %q, want it holding %s", lines.Text(), want)
		}
	}
	if held := heldBy(t, paths...); strings.Join(held, ",") != "GPU-a,GPU-c" {
		t.Errorf("holds %v, want GPU-a and GPU-c", held)
	}
	stop()
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	if exit := <-done; exit != 0 {
		t.Errorf("exit %d when told to stop, want 0", exit)
	}
	if want := "GPUPOOL_GPU_UUIDS=GPU-a,GPU-c\nGPUPOOL_LEASE_ID=lease-000001\nPATH=/bin\n"; stdout.String() != want {
		t.Errorf("stdout %q, want the environment sorted, %q", stdout.String(), want)
	}
	if held := heldBy(t, paths...); len(held) != 0 {
		t.Errorf("still holds %v once stopped", held)
	}
}

// TestDeviceFiles: without GPUPOOL_GPU_UUIDS every device file is held, and
// none without the directory (a pod given no GPU).
func TestDeviceFiles(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"GPU-b", "GPU-a"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o444); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := deviceFiles(dir, []string{"PATH=/bin"})
	if want := []string{filepath.Join(dir, "GPU-a"), filepath.Join(dir, "GPU-b")}; err != nil || strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("without GPUPOOL_GPU_UUIDS: %v, %v; want every file, %v", got, err, want)
	}
	if got, err := deviceFiles(filepath.Join(dir, "none"), nil); err != nil || len(got) != 0 {
		t.Errorf("without the directory: %v, %v; want none", got, err)
	}
}

// TestMissingGPUFails: a GPU named but not mounted is an error, said on
// stderr, not a workload that runs on no GPU.
func TestMissingGPUFails(t *testing.T) {
	var stdout, stderr strings.Builder
	exit := run(context.Background(), []string{"--device-dir", t.TempDir()}, []string{"GPUPOOL_GPU_UUIDS=GPU-x"}, &stdout, &stderr)
	if exit != 1 || !strings.Contains(stderr.String(), "GPU-x") {
		t.Errorf("exit %d, stderr %q; want 1 naming GPU-x", exit, stderr.String())
	}
}

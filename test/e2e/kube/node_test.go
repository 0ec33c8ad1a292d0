package kube

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The kubelet leaves its pods' volumes mounted, some on others, below its
// root directory, whose path may hold a space.
func TestUnmountUnder(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	dir := filepath.Join(t.TempDir(), "kubelet root")
	volume := filepath.Join(dir, "pods", "volume")
	nested := filepath.Join(volume, "nested")
	for _, point := range []string{volume, volume, nested} {
		if err := os.MkdirAll(point, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount("tmpfs", point, "tmpfs", 0, ""); err != nil {
			t.Fatal(err)
		}
	}
	outside := t.TempDir()
	if err := syscall.Mount("tmpfs", outside, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(outside, 0) })

	if err := unmountUnder(dir); err != nil {
		t.Fatal(err)
	}
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if escaped := strings.ReplaceAll(dir, " ", `\040`); strings.Contains(string(mountinfo), escaped) {
		t.Errorf("mounts left under %s:\n%s", dir, mountinfo)
	}
	if !strings.Contains(string(mountinfo), outside) {
		t.Errorf("%s, outside %s, was unmounted too", outside, dir)
	}
}

// A second node waits for the first's lock, and gets it once the first
// releases it.
func TestLockNodeWaitsForTheRunningNode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.lock")
	first, err := lockNode(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	waiting, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if second, err := lockNode(waiting, path); err == nil || !strings.Contains(err.Error(), "another process runs a kubelet node") {
		_ = second.Close()
		t.Fatalf("a second lock while the first is held: %v, want it to wait and give up with the context", err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second, err := lockNode(t.Context(), path)
	if err != nil {
		t.Fatalf("the lock once released: %v", err)
	}
	_ = second.Close()
}

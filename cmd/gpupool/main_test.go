package main

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupool/gpupool/allocator/api"
)

// fakeSimulate writes, in a new directory, a gpupool-simulate that echoes
// its arguments with a tag, says so on stderr and exits 3; it returns the
// directory.
func fakeSimulate(t *testing.T, tag string) string {
	t.Helper()
	dir := t.TempDir()
	script := "#!/bin/sh\necho " + tag + " \"$@\"\necho replaying >&2\nexit 3\n"
	if err := os.WriteFile(filepath.Join(dir, simulateTool.binary), []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestSimulateRunsTheReplayBinary: gpupool simulate runs gpupool-simulate
// with the rest of the command line, its output and exit status passed
// through; one beside gpupool comes before PATH's.
func TestSimulateRunsTheReplayBinary(t *testing.T) {
	t.Setenv("PATH", fakeSimulate(t, "on-path"))
	var stdout, stderr bytes.Buffer
	if code := run([]string{"simulate", "grid", "--seed-sets", "1 2"}, &stdout, &stderr); code != 3 || stdout.String() != "on-path grid --seed-sets 1 2\n" || stderr.String() != "replaying\n" {
		t.Errorf("gpupool simulate grid: exit %d, stdout %q, stderr %q; want gpupool-simulate's 3, its arguments and its stderr", code, stdout.String(), stderr.String())
	}
	beside := fakeSimulate(t, "beside")
	for _, tc := range []struct{ dir, want string }{
		{beside, filepath.Join(beside, simulateTool.binary)},
		{t.TempDir(), filepath.Join(os.Getenv("PATH"), simulateTool.binary)},
		{"", filepath.Join(os.Getenv("PATH"), simulateTool.binary)},
	} {
		if got, err := simulateTool.find(tc.dir); got != tc.want || err != nil {
			t.Errorf("find(%q) = %q, %v; want %q", tc.dir, got, err, tc.want)
		}
	}
}

// TestResumeRunsGpupoolSchedulerResume: gpupool resume is
// gpupool-scheduler resume, with the rest of the command line.
func TestResumeRunsGpupoolSchedulerResume(t *testing.T) {
	dir := t.TempDir()
	script := "#!/bin/sh\necho \"$@\"\nexit 1\n"
	if err := os.WriteFile(filepath.Join(dir, "gpupool-scheduler"), []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"resume", "job/train", "-n", "ml"}, &stdout, &stderr); code != 1 || stdout.String() != "resume job/train -n ml\n" {
		t.Errorf("gpupool resume job/train -n ml: exit %d, stdout %q, stderr %q; want gpupool-scheduler resume's", code, stdout.String(), stderr.String())
	}
}

// TestSimulateSaysHowToGetTheReplay: without gpupool-simulate, gpupool
// simulate says where to get it and exits as a shell does for a command
// it cannot find.
func TestSimulateSaysHowToGetTheReplay(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	var stdout, stderr bytes.Buffer
	code := run([]string{"simulate", "--help"}, &stdout, &stderr)
	want := "gpupool simulate: gpupool-simulate, the trace replay, is neither beside gpupool nor on PATH\n" +
		"  build it with make build (bin/gpupool-simulate) or go install ./cmd/gpupool-simulate, or run it from the gpupool/gpupool image\n"
	if code != exitNotFound || stderr.String() != want || stdout.Len() > 0 {
		t.Errorf("exit %d, stdout %q, stderr\n%s\nwant exit %d and\n%s", code, stdout.String(), stderr.String(), exitNotFound, want)
	}
}

func TestBadUsage(t *testing.T) {
	// Bad run flags are refused before the allocator is asked: here,
	// nothing answers (exit 69 would say it was tried).
	allocator := closedAllocator(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "Usage:"},
		{[]string{"launch"}, 2, `unknown command "launch"`},
		{[]string{"pool"}, 2, "Usage: gpupool pool status"},
		{[]string{"run", "--allocator", allocator}, 2, "no command given"},
		// A zero percent would be left out of the request: whole GPUs.
		{[]string{"run", "--allocator", allocator, "-p", "0", "--", "true"}, 2, "-p: gpu-percent 0 out of range 1..100"},
		{[]string{"run", "--allocator", allocator, "-p", "150", "--", "true"}, 2, "-p: gpu-percent 150 out of range 1..100"},
		{[]string{"run", "--allocator", allocator, "-n", "0", "--", "true"}, 2, "-n: gpu-amount 0 out of range 1..64"},
		{[]string{"run", "--allocator", allocator, "-n", "65", "--", "true"}, 2, "-n: gpu-amount 65 out of range 1..64"},
		{[]string{"run", "--allocator", allocator, "-m", "2Pi", "--", "true"}, 2, "-m: gpu-memory 2Pi out of range 1..1Pi"},
		{[]string{"run", "--allocator", allocator, "-m", "lots", "--", "true"}, 2, "-m: gpu-memory lots is not a quantity"},
		{[]string{"run", "--allocator", allocator, "-p", "50", "-m", "8Gi", "--", "true"}, 2, "-m: gpu-memory 8Gi cannot be combined with gpu-percent"},
		{[]string{"run", "--allocator", allocator, "--wait", "2h", "--", "true"}, 2, "--wait: wait 2h0m0s must be a duration"},
		{[]string{"run", "--allocator", allocator, "--namespace", "ML", "--", "true"}, 2, "--namespace: namespace ML is not a namespace name"},
		{[]string{"run", "--allocator", allocator, "--model", "A100||H100", "--", "true"}, 2, `--model: models "" must be 1..253 characters`},
		{[]string{"run", "--allocator", allocator, "--topology", "nvswitch", "--", "true"}, 2, "--topology: topology nvswitch is not one of any, socket, pcie-switch, nvlink"},
		{[]string{"run", "--allocator", allocator, "--ttl", "1s", "--", "true"}, 2, "--ttl 1s is below the minimum 3s"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stderr.String(), tc.want) || stdout.Len() > 0 {
			t.Errorf("gpupool %v: exit %d, stderr %q, stdout %q; want exit %d, %q on stderr and nothing on stdout",
				tc.args, code, stderr.String(), stdout.String(), tc.code, tc.want)
		}
	}
}

// TestHelpGoesToStdout: asked for, the usage is the output (so that
// `gpupool run --help | less` shows it), and the exit status is 0.
func TestHelpGoesToStdout(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--help"}, "Exit statuses: 0 done"},
		{[]string{"run", "--help"}, "with neither, whole GPUs"},
		{[]string{"run", "-h"}, "-m string"},
		{[]string{"pool", "--help"}, "Usage: gpupool pool status"},
		{[]string{"pool", "status", "--help"}, "Lists the pool's servers and GPUs"},
		{[]string{"leases", "-help"}, "-selector string"},
		{[]string{"quota", "--help"}, "Usage: gpupool quota"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		if code != 0 || !strings.Contains(stdout.String(), tc.want) || stderr.Len() > 0 {
			t.Errorf("gpupool %v: exit %d, stdout %q, stderr %q; want exit 0 and %q on stdout only",
				tc.args, code, stdout.String(), stderr.String(), tc.want)
		}
	}
}

// closedAllocator is an allocator address where nothing listens.
func closedAllocator(*testing.T) string {
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close()
	return srv.URL
}

// TestUnreachableAllocator: every command that talks to the allocator
// says the same when it cannot reach one, how to start one or where to
// point, and exits with 69.
func TestUnreachableAllocator(t *testing.T) {
	if testing.Short() {
		t.Skip("the client retries for 5 s before it gives up")
	}
	allocator := closedAllocator(t)
	for _, tc := range []struct {
		command string
		argv    []string
	}{
		{"run", []string{"run", "--allocator", allocator, "--", "true"}},
		{"pool status", []string{"pool", "status", "--allocator", allocator}},
		{"leases", []string{"leases", "--allocator", allocator}},
		{"quota", []string{"quota", "--allocator", allocator, "--output", "json"}},
	} {
		t.Run(tc.command, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := run(tc.argv, &stdout, &stderr)
			want := "gpupool " + tc.command + ": cannot reach the allocator at " + allocator + ": dial tcp " + strings.TrimPrefix(allocator, "http://") + ": connect: connection refused\n" +
				"  start one (gpupool-allocator --data-dir DIR), or point --allocator or GPUPOOL_ALLOCATOR at a running one\n"
			if code != exitUnavailable || stderr.String() != want || stdout.Len() > 0 {
				t.Errorf("gpupool %v: exit %d, stdout %q, stderr\n%s\nwant exit %d and\n%s", tc.argv, code, stdout.String(), stderr.String(), exitUnavailable, want)
			}
		})
	}
}

// TestAllocatorFailedExitStatus: the allocator's answers map to the exit
// statuses the usage lists, with its message.
func TestAllocatorFailedExitStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
	}{
		{&api.Error{Reason: api.ReasonNoCapacity, Message: "m"}, exitNoCapacity},
		{&api.Error{Reason: api.ReasonQuotaExceeded, Message: "m"}, exitNoPermit},
		{&api.Error{Reason: api.ReasonForbidden, Message: "m"}, exitNoPermit},
		{&api.Error{Reason: api.ReasonUnauthorized, Message: "m"}, exitNoPermit},
		{&api.Error{Reason: api.ReasonInvalid, Message: "m"}, exitUsage},
		{&api.Error{Reason: api.ReasonUnavailable, Message: "m"}, exitUnavailable},
		{&api.Error{Reason: api.ReasonInternal, Message: "m"}, exitUnavailable},
		{&api.Error{Reason: api.ReasonNotFound, Message: "m"}, exitFailed},
		{fmt.Errorf("context deadline exceeded (last: %w)", &api.Error{Reason: api.ReasonUnavailable, Message: "m"}), exitUnavailable},
		{errors.New("m"), exitFailed},
	} {
		var stderr bytes.Buffer
		if code := allocatorFailed(&stderr, "leases", tc.err); code != tc.code || stderr.String() != "gpupool leases: m\n" {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and the message", tc.err, code, stderr.String(), tc.code)
		}
	}
}

func TestReadPodLabels(t *testing.T) {
	path := filepath.Join(t.TempDir(), "labels")
	if err := os.WriteFile(path, []byte("app=\"tf-training\"\npod-template-hash=\"5d8f\"\nteam=\"a \\\"b\\\"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readPodLabels(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"app": "tf-training", "pod-template-hash": "5d8f", "team": `a "b"`}
	if !maps.Equal(got, want) {
		t.Errorf("labels = %v, want %v", got, want)
	}
	if err := os.WriteFile(path, []byte("app=tf-training\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readPodLabels(path); err == nil {
		t.Error("an unquoted value was taken")
	}
}

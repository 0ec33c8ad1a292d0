package main

import (
	"bytes"
	"encoding/json"
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
	"github.com/gpupool/gpupool/simulate"
)

func TestSimulateJSON(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"simulate", "--seeds", "42-43", "--policies", "best-fit,fgd-cpu", "--output", "json"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
	}
	var got []map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("stdout is not a JSON array: %v\n%s", err, stdout.String())
	}
	if len(got) != 2 || got[0]["policy"] != "best-fit" || got[1]["policy"] != "fgd-cpu" {
		t.Fatalf("want one object per policy in order, got %v", got)
	}
	for _, field := range []string{"unallocated_gpu_pct_at_100", "unallocated_gpu_pct_at_130", "fragmentation_ratio_pct_at_90", "decisions_per_second",
		"multi_gpu_well_linked_pct", "multi_gpu_one_socket_pct", "pods_arrived_at_100", "pods_placed_at_100", "busy_gpus_at_100", "placed_ask_pct_at_100"} {
		v, ok := got[0][field].(float64)
		if !ok || v <= 0 {
			t.Errorf("field %s = %v, want a positive number", field, got[0][field])
		}
	}
	if !strings.Contains(stderr.String(), "[4/4]") {
		t.Errorf("no progress on stderr:\n%s", stderr.String())
	}
}

func TestSimulateTable(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"simulate", "--seeds", "42", "--policies", "random"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
	}
	if lines := strings.Split(strings.TrimSpace(stdout.String()), "\n"); len(lines) != 2 || !strings.Contains(lines[1], "random") {
		t.Errorf("want a header and one row, got:\n%s", stdout.String())
	}
}

// TestSimulateWritesTheVariant: --write-pods writes the derived pods, which
// read back with the variant's shares, and replays nothing.
func TestSimulateWritesTheVariant(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pods.csv")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"simulate", "--variant", "models=25%,multi-gpu=10%", "--variant-seed", "3", "--write-pods", file}, &stdout, &stderr); code != 0 || stdout.Len() > 0 || stderr.Len() > 0 {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 0 and no output", code, stdout.String(), stderr.String())
	}
	tr, err := simulate.LoadTrace(simulate.DefaultNodes, file)
	if err != nil {
		t.Fatal(err)
	}
	named, multi := 0, 0
	for _, p := range tr.Pods {
		if len(p.Models) > 0 {
			named++
		}
		if p.GPUs > 1 {
			multi++
		}
	}
	if len(tr.Pods) != 8152 || named != 1766 || multi != 706 {
		t.Errorf("%d pods, %d name models, %d multi-GPU; want 8152, 1766 and 706 (25%% and 10%% of 7064)", len(tr.Pods), named, multi)
	}
	if code := run([]string{"simulate", "--write-pods", "-"}, &stdout, &stderr); code != 0 || !strings.HasPrefix(stdout.String(), "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\nopenb-pod-0000,") {
		t.Errorf("--write-pods -: exit %d, stdout begins %.80q", code, stdout.String())
	}
}

// TestSimulateGrid: the grid is a markdown table with a row per variant
// and seed set; it fails naming the cells where --policy does worse than
// --baseline, and passes where it does not.
func TestSimulateGrid(t *testing.T) {
	grid := []string{"simulate", "grid", "--variants", "as is;cpu=x0.5", "--seed-sets", "1 2"}
	var stdout, stderr bytes.Buffer
	if code := run(append(grid, "--policy", "random", "--baseline", "fgd-cpu"), &stdout, &stderr); code != 1 {
		t.Fatalf("random against fgd-cpu: exit %d, want 1; stderr:\n%s", code, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 8 || !strings.HasPrefix(lines[0], "| variant | seeds | random at 100% | fgd-cpu at 100% |") ||
		!strings.HasPrefix(lines[5], "| cpu=x0.5 | 2 | **") || !strings.Contains(lines[7], "bold: random leaves more than fgd-cpu (8 of 8)") {
		t.Errorf("want a header, a rule, 4 rows with random's numbers in bold and a summary, got:\n%s", stdout.String())
	}
	if !strings.Contains(stderr.String(), "random leaves more unallocated than fgd-cpu in 8 cells: as is seeds 1 at 100% (") {
		t.Errorf("stderr does not name the cells:\n%s", stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	if code := run(append(grid, "--policy", "fgd-cpu", "--baseline", "random"), &stdout, &stderr); code != 0 || strings.Contains(stdout.String(), "**") {
		t.Errorf("fgd-cpu against random: exit %d, want 0 and nothing in bold; stdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
}

// TestSimulateSharing: a markdown table with a row per embedded trace.
func TestSimulateSharing(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"simulate", "sharing", "--seeds", "42", "--policy", "best-fit"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 6 || !strings.HasPrefix(lines[0], "| trace | pods arrived | pods placed, shared | exclusive |") {
		t.Fatalf("want a header, a rule and 4 rows, got:\n%s", stdout.String())
	}
	for i, name := range []string{"default", "gpushare40", "gpuspec10", "multigpu20"} {
		if !strings.HasPrefix(lines[2+i], "| "+name+" | ") {
			t.Errorf("row %d is %q, want trace %s", i, lines[2+i], name)
		}
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
		{[]string{"simulate", "--policies", "fgd,tetris"}, 2, `--policies "fgd,tetris": policy tetris is not one of best-fit, fgd, fgd-cpu, random, spread`},
		{[]string{"simulate", "--policies", "fdg"}, 2, `gpupool simulate: --policies "fdg": policy fdg is not one of`},
		{[]string{"simulate", "--seeds", "9-3"}, 2, `--seeds "9-3": "9-3" is not a range low-high`},
		{[]string{"simulate", "--output", "yaml"}, 2, `--output "yaml" is not one of table, json`},
		{[]string{"simulate", "--topology", "nvlink"}, 2, `--topology "nvlink" is not one of blind, aware`},
		{[]string{"simulate", "--pods", "/nonexistent.csv"}, 1, "/nonexistent.csv: no such file or directory; the embedded traces are traces/openb_node_list_gpu_node.csv, traces/openb_pod_list_default.csv, traces/openb_pod_list_gpushare40.csv"},
		{[]string{"simulate", "--bogus"}, 2, "flag provided but not defined: -bogus"},
		{[]string{"simulate", "grid", "--variants", "as is;models=200%"}, 2, `--variants: "models=200%": models 200% out of range 0%..100%`},
		{[]string{"simulate", "grid", "--seed-sets", " "}, 2, `--seed-sets " ": no seed set`},
		{[]string{"simulate", "grid", "--baseline", "tetris"}, 2, "--baseline: policy tetris is not one of"},
		{[]string{"simulate", "sharing", "--seeds", "x"}, 2, `--seeds "x": "x" is not a number`},
		{[]string{"simulate", "sharing", "--policy", "tetris"}, 2, "--policy: policy tetris is not one of"},
		{[]string{"simulate", "--variant", "models=25%,cpu=2"}, 2, `--variant "models=25%,cpu=2": cpu 2 is not a factor such as x0.5`},
		{[]string{"simulate", "--variant", "multi-gpu=60%"}, 1, `--variant "multi-gpu=60%" on traces/openb_pod_list_default.csv: 3078 fractional and 4238 multi-GPU pods of 7064 GPU pods: more than all of them`},
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
		{[]string{"simulate", "--help"}, "Replays an Alibaba OpenB GPU trace"},
		{[]string{"simulate", "-h"}, "multi-gpu=P%   P% of the GPU pods ask for more than one GPU"},
		{[]string{"simulate", "grid", "--help"}, "Usage: gpupool simulate grid"},
		{[]string{"simulate", "sharing", "--help"}, "Usage: gpupool simulate sharing"},
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

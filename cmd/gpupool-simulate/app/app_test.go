package app

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupool/gpupool/simulate"
)

func TestReplayJSON(t *testing.T) {
	var stdout, stderr bytes.Buffer
	o := valid(t, &ReplayOptions{}, "--seeds", "42-43", "--policies", "best-fit,fgd-cpu", "--output", "json")
	if err := RunReplay(o, &stdout, &stderr); err != nil {
		t.Fatalf("%v, stderr:\n%s", err, stderr.String())
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

func TestReplayTable(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := RunReplay(valid(t, &ReplayOptions{}, "--seeds", "42", "--policies", "random"), &stdout, &stderr); err != nil {
		t.Fatalf("%v, stderr:\n%s", err, stderr.String())
	}
	if lines := strings.Split(strings.TrimSpace(stdout.String()), "\n"); len(lines) != 2 || !strings.Contains(lines[1], "random") {
		t.Errorf("want a header and one row, got:\n%s", stdout.String())
	}
}

// TestReplayWritesTheVariant: --write-pods writes the derived pods, which
// read back with the variant's shares, and replays nothing.
func TestReplayWritesTheVariant(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pods.csv")
	var stdout, stderr bytes.Buffer
	o := valid(t, &ReplayOptions{}, "--variant", "models=25%,multi-gpu=10%", "--variant-seed", "3", "--write-pods", file)
	if err := RunReplay(o, &stdout, &stderr); err != nil || stdout.Len() > 0 || stderr.Len() > 0 {
		t.Fatalf("%v, stdout %q, stderr %q; want no error and no output", err, stdout.String(), stderr.String())
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
	if err := RunReplay(valid(t, &ReplayOptions{}, "--write-pods", "-"), &stdout, &stderr); err != nil || !strings.HasPrefix(stdout.String(), "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\nopenb-pod-0000,") {
		t.Errorf("--write-pods -: %v, stdout begins %.80q", err, stdout.String())
	}
}

// TestReplayFailures: a trace that does not load, or a variant the pods
// cannot meet, fails the replay saying why, and nothing is written.
func TestReplayFailures(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--pods", "/nonexistent.csv"}, "/nonexistent.csv: no such file or directory; the embedded traces are traces/openb_node_list_gpu_node.csv, traces/openb_pod_list_default.csv, traces/openb_pod_list_gpushare40.csv"},
		{[]string{"--variant", "multi-gpu=60%"}, `--variant "multi-gpu=60%" on traces/openb_pod_list_default.csv: 3078 fractional and 4238 multi-GPU pods of 7064 GPU pods: more than all of them`},
	} {
		var stdout, stderr bytes.Buffer
		err := RunReplay(valid(t, &ReplayOptions{}, tc.args...), &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tc.want) || stdout.Len() > 0 || stderr.Len() > 0 {
			t.Errorf("%q: %v, stdout %q, stderr %q; want %q and no output", tc.args, err, stdout.String(), stderr.String(), tc.want)
		}
	}
}

// TestGrid: the grid is a markdown table with a row per variant and seed
// set; it fails naming the cells where --policy does worse than
// --baseline, and passes where it does not.
func TestGrid(t *testing.T) {
	grid := []string{"--variants", "as is;cpu=x0.5", "--seed-sets", "1 2"}
	var stdout, stderr bytes.Buffer
	err := RunGrid(valid(t, &GridOptions{}, append(grid, "--policy", "random", "--baseline", "fgd-cpu")...), &stdout, &stderr)
	if err == nil || !strings.HasPrefix(err.Error(), "random leaves more unallocated than fgd-cpu in 8 cells: as is seeds 1 at 100% (") {
		t.Errorf("random against fgd-cpu: %v; want the cells named", err)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 8 || !strings.HasPrefix(lines[0], "| variant | seeds | random at 100% | fgd-cpu at 100% |") ||
		!strings.HasPrefix(lines[5], "| cpu=x0.5 | 2 | **") || !strings.Contains(lines[7], "bold: random leaves more than fgd-cpu (8 of 8)") {
		t.Errorf("want a header, a rule, 4 rows with random's numbers in bold and a summary, got:\n%s", stdout.String())
	}
	stdout.Reset()
	stderr.Reset()
	if err := RunGrid(valid(t, &GridOptions{}, append(grid, "--policy", "fgd-cpu", "--baseline", "random")...), &stdout, &stderr); err != nil || strings.Contains(stdout.String(), "**") {
		t.Errorf("fgd-cpu against random: %v, want none and nothing in bold; stdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
}

// TestSharing: a markdown table with a row per embedded trace.
func TestSharing(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := RunSharing(valid(t, &SharingOptions{}, "--seeds", "42", "--policy", "best-fit"), &stdout, &stderr); err != nil {
		t.Fatalf("%v, stderr:\n%s", err, stderr.String())
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

// TestCommand: grid and sharing name their commands, and anything else
// is the replay's flags.
func TestCommand(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		name    string
		rest    []string
		options string
	}{
		{nil, "gpupool-simulate", nil, "*app.ReplayOptions"},
		{[]string{"--seeds", "1"}, "gpupool-simulate", []string{"--seeds", "1"}, "*app.ReplayOptions"},
		{[]string{"grid", "--seed-sets", "1"}, "gpupool-simulate grid", []string{"--seed-sets", "1"}, "*app.GridOptions"},
		{[]string{"sharing"}, "gpupool-simulate sharing", []string{}, "*app.SharingOptions"},
		{[]string{"gird"}, "gpupool-simulate", []string{"gird"}, "*app.ReplayOptions"},
	} {
		tool, rest := Command(tc.args)
		if tool.Name != tc.name || strings.Join(rest, " ") != strings.Join(tc.rest, " ") || fmt.Sprintf("%T", tool.Options) != tc.options {
			t.Errorf("%q: %s with %q and %T; want %s with %q and %s", tc.args, tool.Name, rest, tool.Options, tc.name, tc.rest, tc.options)
		}
	}
}

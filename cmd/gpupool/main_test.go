package main

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	for _, field := range []string{"unallocated_gpu_pct_at_100", "unallocated_gpu_pct_at_130", "fragmentation_ratio_pct_at_90", "decisions_per_second"} {
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

func TestBadUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "Usage:"},
		{[]string{"launch"}, 2, `unknown command "launch"`},
		{[]string{"simulate", "--policies", "fgd,tetris"}, 2, "policy tetris is not one of best-fit, fgd, fgd-cpu, random, spread"},
		{[]string{"simulate", "--seeds", "9-3"}, 2, `--seeds "9-3"`},
		{[]string{"simulate", "--output", "yaml"}, 2, `--output "yaml" is not one of table, json`},
		{[]string{"simulate", "--pods", "/nonexistent.csv"}, 1, "/nonexistent.csv"},
		{[]string{"simulate", "--help"}, 0, "Replays an Alibaba OpenB GPU trace"},
		// A zero percent would be left out of the request: whole GPUs.
		{[]string{"run", "-p", "0", "--", "true"}, 2, "gpu-percent 0 out of range 1..100"},
		{[]string{"run", "-p", "150", "--", "true"}, 2, "gpu-percent 150 out of range 1..100"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stderr.String()+stdout.String(), tc.want) {
			t.Errorf("gpupool %v: exit %d, output %q; want exit %d and %q", tc.args, code, stderr.String(), tc.code, tc.want)
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

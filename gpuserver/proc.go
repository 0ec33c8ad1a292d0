package gpuserver

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// statFields reads <proc>/<pid>/stat and returns its fields from the
// third (state) on: the command name before them may hold spaces and
// parentheses, so they start after the last ')'.
func statFields(proc string, pid int) []string {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "stat")) //nolint:gosec // a /proc path built from a PID
	if err != nil {
		return nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

// ProcParent reads a process's parent PID from <proc>/<pid>/stat.
func ProcParent(proc string) func(pid int) (int, bool) {
	return func(pid int) (int, bool) {
		f := statFields(proc, pid)
		if len(f) < 2 {
			return 0, false
		}
		ppid, err := strconv.Atoi(f[1]) // field 4
		return ppid, err == nil
	}
}

// ProcStartTime reads when a process started, in clock ticks after boot,
// from <proc>/<pid>/stat (field 22, starttime): a PID and its start time
// name one process, where a PID alone may be reused by a later one.
func ProcStartTime(proc string) func(pid int) (uint64, bool) {
	return func(pid int) (uint64, bool) {
		f := statFields(proc, pid)
		if len(f) < 20 {
			return 0, false
		}
		start, err := strconv.ParseUint(f[19], 10, 64) // field 22
		return start, err == nil
	}
}

// PodUID reads the Kubernetes pod UID from <proc>/<pid>/cgroup, where the
// kubelet's cgroup path carries it (pod<uid> with '_' for '-' under
// systemd, or pod<uid> under cgroupfs); "" when the process is in no pod.
func PodUID(proc string, pid int) string {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "cgroup")) //nolint:gosec // a /proc path built from a PID
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		for _, part := range strings.Split(line, "/") {
			part = strings.TrimSuffix(part, ".slice")
			i := strings.LastIndex(part, "pod")
			if i < 0 {
				continue
			}
			uid := strings.ReplaceAll(part[i+3:], "_", "-")
			if len(uid) == 36 && strings.Count(uid, "-") == 4 {
				return uid
			}
		}
	}
	return ""
}

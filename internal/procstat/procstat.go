// Package procstat reads a running process's CPU time and memory from
// /proc, for the tools and tests that measure gpupool's processes.
package procstat

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Usage is a process's CPU time and memory at one moment.
type Usage struct {
	// CPU is its user and system time so far.
	CPU time.Duration
	// RSS is its resident memory (VmRSS), RSSAnon the part that is no
	// file's pages (RssAnon: its binary's code and data are files' pages,
	// which the kernel may drop and read again), PeakRSS the most RSS it
	// has had (VmHWM); all in bytes.
	RSS, RSSAnon, PeakRSS int64
}

// clockTicks is the unit of /proc/<pid>/stat's times: USER_HZ, 100 on
// every Linux architecture Go runs on.
const clockTicks = 100

// Read reads process pid's usage from /proc/<pid>/stat and status.
func Read(pid int) (Usage, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Usage{}, err
	}
	cpu, err := cpuTime(stat)
	if err != nil {
		return Usage{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Usage{}, err
	}
	u := Usage{CPU: cpu}
	for _, f := range []struct {
		name string
		into *int64
	}{{"VmRSS", &u.RSS}, {"RssAnon", &u.RSSAnon}, {"VmHWM", &u.PeakRSS}} {
		if *f.into, err = statusKB(status, f.name); err != nil {
			return Usage{}, fmt.Errorf("/proc/%d/status: %w", pid, err)
		}
	}
	return u, nil
}

// cpuTime is utime plus stime of a /proc/<pid>/stat.
func cpuTime(stat []byte) (time.Duration, error) {
	// The command name, in parentheses, may hold spaces: the fields
	// counted from stat(5)'s third, the state, start after its closing
	// one; utime and stime are the 14th and 15th.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("%d fields after the command name, want at least 13", len(fields))
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// statusKB reads a field of a /proc/<pid>/status, which gives it in kB,
// in bytes.
func statusKB(status []byte, field string) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		value, ok := strings.CutPrefix(sc.Text(), field+":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s %q: %w", field, value, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("no %s (a zombie has none)", field)
}

// Machine is the whole machine's CPU time so far, all CPUs summed, from
// /proc/stat: what a process's own time does not say, whether the CPU
// was free beside it.
type Machine struct {
	// Busy is user, nice, system, irq and softirq time; Idle idle and
	// iowait; Steal the time a hypervisor ran another guest on these
	// CPUs, which no process here sees.
	Busy, Idle, Steal time.Duration
}

// ReadMachine reads the machine's CPU time from /proc/stat.
func ReadMachine() (Machine, error) {
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return Machine{}, err
	}
	m, err := machineTime(stat)
	if err != nil {
		return Machine{}, fmt.Errorf("/proc/stat: %w", err)
	}
	return m, nil
}

// machineTime parses /proc/stat's first line, "cpu" and its times in
// clock ticks: user nice system idle iowait irq softirq steal (proc(5)).
func machineTime(stat []byte) (Machine, error) {
	line, _, _ := bytes.Cut(stat, []byte{'\n'})
	fields := strings.Fields(string(line))
	if len(fields) < 9 || fields[0] != "cpu" {
		return Machine{}, fmt.Errorf("first line %q: want cpu and at least 8 times", line)
	}
	var ticks [8]int64
	for i := range ticks {
		v, err := strconv.ParseInt(fields[i+1], 10, 64)
		if err != nil {
			return Machine{}, err
		}
		ticks[i] = v
	}
	d := func(t int64) time.Duration { return time.Duration(t) * time.Second / clockTicks }
	return Machine{Busy: d(ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6]), Idle: d(ticks[3] + ticks[4]), Steal: d(ticks[7])}, nil
}

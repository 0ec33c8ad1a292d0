package procstat

import (
	"os"
	"testing"
	"time"
)

func TestStatusKB(t *testing.T) {
	status := []byte("Name:\tgpupool-server\nVmPeak:\t 1265556 kB\nVmRSS:\t   21504 kB\nRssAnon:\t    9000 kB\n")
	if got, err := statusKB(status, "VmRSS"); err != nil || got != 21504<<10 {
		t.Errorf("VmRSS = %d, %v; want %d", got, err, 21504<<10)
	}
	if got, err := statusKB(status, "RssAnon"); err != nil || got != 9000<<10 {
		t.Errorf("RssAnon = %d, %v; want %d", got, err, 9000<<10)
	}
	// A zombie's status has no VmRSS.
	if _, err := statusKB([]byte("Name:\tgpupool-server\nState:\tZ (zombie)\n"), "VmRSS"); err == nil {
		t.Error("no error without VmRSS")
	}
}

func TestCPUTimeOfACommandWithSpaces(t *testing.T) {
	stat := []byte("4242 (my cmd) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 8 0 100 0 0")
	if got, err := cpuTime(stat); err != nil || got != 3*time.Second {
		t.Errorf("cpuTime = %v, %v; want 3s (250 + 50 ticks)", got, err)
	}
	if _, err := cpuTime([]byte("4242 (short) S 1")); err == nil {
		t.Error("no error for a stat cut short")
	}
}

func TestReadThisProcess(t *testing.T) {
	u, err := Read(os.Getpid())
	if err != nil || u.RSSAnon <= 0 || u.RSS < u.RSSAnon || u.PeakRSS < u.RSS {
		t.Errorf("Read(self) = %+v, %v; want 0 < RssAnon <= VmRSS <= VmHWM", u, err)
	}
	if _, err := Read(1 << 30); err == nil {
		t.Error("no error for a process that does not exist")
	}
}

func TestMachineTime(t *testing.T) {
	stat := []byte("cpu  700 60 150 6000 40 0 10 25 0 0\ncpu0 350 30 75 3000 20 0 5 12 0 0\n")
	want := Machine{Busy: 9200 * time.Millisecond, Idle: 60400 * time.Millisecond, Steal: 250 * time.Millisecond}
	if got, err := machineTime(stat); err != nil || got != want {
		t.Errorf("machineTime = %+v, %v; want %+v", got, err, want)
	}
	for _, bad := range []string{"", "intr 1 2 3", "cpu 1 2 3", "cpu 1 2 x 4 5 6 7 8"} {
		if _, err := machineTime([]byte(bad)); err == nil {
			t.Errorf("no error for %q", bad)
		}
	}
	if m, err := ReadMachine(); err != nil || m.Busy <= 0 || m.Idle < 0 {
		t.Errorf("ReadMachine() = %+v, %v; want some busy time", m, err)
	}
}

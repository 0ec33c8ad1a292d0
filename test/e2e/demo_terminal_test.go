package e2e

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDemoInTerminal runs `make demo DEMO_FLAGS=--duration=0` on a
// pseudo-terminal, as README's first command runs in a user's terminal:
// make says it builds before the screen stays blank, every frame keeps the
// URLs in sight, and a Ctrl-C typed there stops the demo and make with
// status 0, without a make error.
func TestDemoInTerminal(t *testing.T) {
	const demoBuildTimeout = 10 * time.Minute
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	terminal, tty := openPTY(t)
	cmd := exec.Command("make", "demo", "DEMO_FLAGS=--duration=0")
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "TMPDIR="+t.TempDir())
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	// make leads a session whose controlling terminal is tty, as a shell's
	// foreground job does: Ctrl-C signals its process group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	startWithDefaultInterrupt(t, cmd)
	_ = tty.Close()
	var out syncBuffer
	go func() { _, _ = io.Copy(&out, terminal) }()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	// The build is make's, and on a cold build cache it takes minutes on
	// 2 busy cores; the frames' time starts when the demo does.
	const clear = "\033[H\033[2J"
	for deadline := time.Now().Add(demoBuildTimeout); !strings.Contains(out.String(), "gpupool-demo: allocator"); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the demo did not start %v after make demo:\n%s", demoBuildTimeout, out.String())
		}
	}
	var frame string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		// A frame ends with the HPA signal's line; the second one shows
		// what stays on the screen.
		frames := strings.Split(out.String(), clear)
		if len(frames) > 2 && strings.Contains(frames[2], "HPA signal:") {
			frame = frames[2]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no second frame a minute after the demo started:\n%s", out.String())
		}
	}
	building, header := strings.Index(out.String(), "building the demo"), strings.Index(out.String(), "gpupool-demo: allocator")
	if building < 0 || building > header {
		t.Errorf("make did not say it builds before the demo's first line:\n%s", out.String())
	}
	for _, want := range []string{"gpupool-demo: allocator http://", "external metrics: https://", "pool status"} {
		if !strings.Contains(frame, want) {
			t.Errorf("a later frame lacks %q:\n%s", want, frame)
		}
	}
	if n := strings.Count(frame, "/metrics"); n != 5 {
		t.Errorf("a later frame shows %d /metrics URLs, want the allocator's, 3 servers' and the adapter's:\n%s", n, frame)
	}

	if _, err := terminal.Write([]byte{3}); err != nil { // Ctrl-C, as typed
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("make demo after Ctrl-C: %v, want status 0:\n%s", err, out.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("make demo still runs a minute after Ctrl-C:\n%s", out.String())
	}
	if s := out.String(); !strings.Contains(s, "gpupool-demo: stopped") || strings.Contains(s, "make: ***") {
		t.Errorf("want the demo stopped and no make error:\n%s", s)
	}
}

// openPTY opens a pseudo-terminal: the terminal side, which the test types
// into and reads the screen from, and the tty a program runs on.
func openPTY(t *testing.T) (terminal, tty *os.File) {
	t.Helper()
	terminal, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals: %v", err)
	}
	t.Cleanup(func() { _ = terminal.Close() })
	fd := int(terminal.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return terminal, tty
}

// startWithDefaultInterrupt starts cmd with SIGINT at its default action,
// as a terminal's shell starts a job, even when the test runs with SIGINT
// ignored (a background job of a shell without job control): ignored
// signals are inherited, caught ones are reset on exec.
func startWithDefaultInterrupt(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	caught := make(chan os.Signal, 1)
	signal.Notify(caught, os.Interrupt)
	defer signal.Stop(caught)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
}

// Package e2e runs gpupool's binaries as users do and checks what they see.
package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/client"
)

// binDir holds the binaries built once for all tests.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gpupool-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	build := exec.Command("go", "build", "-o", dir, "../../cmd/gpupool", "../../cmd/gpupool-allocator", "../../cmd/gpupool-server", "../../cmd/gpupool-adapter")
	build.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the binaries:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// allocatorProcess is a running gpupool-allocator.
type allocatorProcess struct {
	cmd  *exec.Cmd
	URL  string
	logs *syncBuffer
	done chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var (
	addressLine = regexp.MustCompile(`address=(http://\S+)`)
	// readyLine is logged when the replica serves the API or stands by.
	readyLine = regexp.MustCompile(`allocator ready|standing by for leadership`)
)

// startAllocator starts the binary on a free loopback port and waits until
// it serves.
func startAllocator(t testing.TB, args ...string) *allocatorProcess {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "gpupool-allocator"), append([]string{"--listen", "127.0.0.1:0"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &allocatorProcess{cmd: cmd, logs: &syncBuffer{}, done: make(chan struct{})}
	found, ready := make(chan string, 1), make(chan struct{}, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(p.logs, line)
			if m := addressLine.FindStringSubmatch(line); m != nil {
				found <- m[1]
			}
			if readyLine.MatchString(line) {
				ready <- struct{}{}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { p.kill() })
	p.URL = await(t, p, found)
	await(t, p, ready)
	return p
}

// await waits for the process to log what ch reports.
func await[T any](t testing.TB, p *allocatorProcess, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-p.done:
		t.Fatalf("allocator exited:\n%s", p.logs)
	case <-time.After(20 * time.Second):
		t.Fatalf("allocator did not start:\n%s", p.logs)
	}
	var zero T
	return zero
}

func (p *allocatorProcess) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

func newClient(t testing.TB, url, token string) *client.Client {
	t.Helper()
	c, err := client.New([]string{url}, token)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func gpuServer(name string, gpus int) allocator.Server {
	s := allocator.Server{Name: name, CPUMilli: 96000, MemoryBytes: 512 << 30}
	for i := range gpus {
		s.GPUs = append(s.GPUs, allocator.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", name, i), Model: "H100", MemoryBytes: 80 << 30, Healthy: true})
	}
	return s
}

func register(t testing.TB, c *client.Client, servers ...allocator.Server) {
	t.Helper()
	for _, s := range servers {
		if err := c.RegisterServer(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
}

// gpupool runs the CLI and returns its output and exit status.
func gpupool(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "gpupool"), args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

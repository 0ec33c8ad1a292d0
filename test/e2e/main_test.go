// Package e2e runs gpupool's binaries as users do and checks what they see.
package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
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

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	e2ekube "github.com/gpupool/gpupool/test/e2e/kube"
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
	build := exec.Command("go", "build", "-o", dir, "../../cmd/gpupool", "../../cmd/gpupool-demo", "../../cmd/gpupool-allocator", "../../cmd/gpupool-server", "../../cmd/gpupool-adapter", "../../cmd/gpupool-webhook", "../../cmd/gpupool-scheduler", "../../cmd/gpupool-device-plugin", "../../cmd/gpupool-load", "./gpuload")
	build.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the binaries:", err)
		os.Exit(1)
	}
	// GPUPOOL_E2E_ALLOCATOR runs the tests against another allocator
	// binary, e.g. an older commit's, to see a test fail before its fix.
	if old := os.Getenv("GPUPOOL_E2E_ALLOCATOR"); old != "" {
		b, err := os.ReadFile(old)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "gpupool-allocator"), b, 0o755)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "GPUPOOL_E2E_ALLOCATOR:", err)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "e2e: running the allocator", old)
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
	addressLine = regexp.MustCompile(`address=(https?://\S+)`)
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
				select {
				case ready <- struct{}{}:
				default: // a replica stands by and leads again and again; the first is awaited
				}
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

func gpuServer(name string, gpus int) api.Server {
	s := api.Server{Name: name, CPUMilli: 96000, MemoryBytes: 512 << 30}
	for i := range gpus {
		s.GPUs = append(s.GPUs, api.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", name, i), Model: "H100", MemoryBytes: 80 << 30, Healthy: true})
	}
	return s
}

func register(t testing.TB, c *client.Client, servers ...api.Server) {
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

// poolConfig is an allocator config written as deploy/base's is: tokens on
// for everyone, each with its own.
type poolConfig struct {
	// Path is the allocator's --config.
	Path string
	// Admin is an operator's token; Reader the adapter's, which only
	// reads; Servers the gpupool-server daemons' (one for all, as the
	// DaemonSet's Secret).
	Admin, Reader, Servers string
	// Tenant is each namespace's token, what its pods' `gpupool run` holds.
	Tenant map[string]string
}

// noQuota is a namespace with a token and no quota.
const noQuota = -1

// writePoolConfig writes an allocator config with an admin token, a
// servers token and a token per namespace of quotas, whose value is the
// namespace's quota in percent of one GPU (or noQuota). The tokens are
// random: no test leans on a well-known one.
func writePoolConfig(t testing.TB, quotas map[string]int64) *poolConfig {
	t.Helper()
	dir := t.TempDir()
	c := &poolConfig{Path: filepath.Join(dir, "allocator-config.yaml"), Admin: "admin-" + rand.Text(),
		Reader: "reader-" + rand.Text(), Servers: "servers-" + rand.Text(), Tenant: map[string]string{}}
	var b strings.Builder
	fmt.Fprintf(&b, "admin: {tokens: [%s]}\nreaders: {tokens: [%s]}\nservers: {tokens: [%s]}\nnamespaces:\n", c.Admin, c.Reader, c.Servers)
	for ns, quota := range quotas {
		c.Tenant[ns] = ns + "-" + rand.Text()
		fmt.Fprintf(&b, "  %s:\n    tokens: [%s]\n", ns, c.Tenant[ns])
		if quota != noQuota {
			fmt.Fprintf(&b, "    hard: {requests.bitfusion.io/gpu: %d}\n", quota)
		}
	}
	if err := os.WriteFile(c.Path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return c
}

// setIdlePolicy gives namespace ns, which the config lists, the idle
// policy policy, a YAML flow map.
func (c *poolConfig) setIdlePolicy(t testing.TB, ns, policy string) {
	t.Helper()
	b, err := os.ReadFile(c.Path)
	if err != nil {
		t.Fatal(err)
	}
	entry := fmt.Sprintf("  %s:\n    tokens: [%s]\n", ns, c.Tenant[ns])
	if !strings.Contains(string(b), entry) {
		t.Fatalf("the config lists no namespace %s", ns)
	}
	b = []byte(strings.Replace(string(b), entry, entry+"    idle: "+policy+"\n", 1))
	if err := os.WriteFile(c.Path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// tenantEnv is the environment of a `gpupool` command acting in namespace
// ns with its token, as a pod of ns runs it.
func (c *poolConfig) tenantEnv(t testing.TB, allocatorURL, ns string) []string {
	t.Helper()
	token, ok := c.Tenant[ns]
	if !ok {
		t.Fatalf("namespace %s has no token in the config", ns)
	}
	return []string{"GPUPOOL_ALLOCATOR=" + allocatorURL, "GPUPOOL_TOKEN=" + token, "GPUPOOL_NAMESPACE=" + ns}
}

// adminTokenFile writes the admin token to a file, the adapter's
// --allocator-token-file (a Secret's key mounted as a file).
func (c *poolConfig) adminTokenFile(t testing.TB) string {
	return c.tokenFile(t, "admin-token", c.Admin)
}

// serversTokenFile writes the servers token to a file, the device plugin's
// --token-file.
func (c *poolConfig) serversTokenFile(t testing.TB) string {
	return c.tokenFile(t, "servers-token", c.Servers)
}

func (c *poolConfig) tokenFile(t testing.TB, name, token string) string {
	t.Helper()
	path := filepath.Join(filepath.Dir(c.Path), name)
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startDaemon runs gpupool-server until the test ends, as
// deploy/base/server.yaml runs it: the servers token in GPUPOOL_TOKEN (not
// on the command line, which every process on the host can read) and no
// process socket (so that no two tests' daemons share
// /run/gpupool/<name>.sock; args may name one). It waits until the daemon
// serves.
func startDaemon(t testing.TB, logs *syncBuffer, token string, args ...string) *exec.Cmd {
	t.Helper()
	return startBinaryEnv(t, logs, []string{"GPUPOOL_TOKEN=" + token}, "gpupool-server", regexp.MustCompile(`gpu server serving`),
		append([]string{"--process-socket="}, args...)...)
}

// startControlPlane starts the Kubernetes control plane that `make kube`
// built into $KUBE_BIN_DIR (the test is skipped without it), stopped when
// the test ends, and returns it with that directory. If the test fails, its
// log ends with the control plane's logs and the tail of logs, where the
// test's own processes write (nil: none).
func startControlPlane(ctx context.Context, t *testing.T, logs *syncBuffer) (*e2ekube.ControlPlane, string) {
	t.Helper()
	return startControlPlaneWith(ctx, t, logs, e2ekube.Options{})
}

// startControlPlaneWith is startControlPlane with o's settings; it sets
// o.BinDir and o.Dir.
func startControlPlaneWith(ctx context.Context, t *testing.T, logs *syncBuffer, o e2ekube.Options) (*e2ekube.ControlPlane, string) {
	t.Helper()
	bins := os.Getenv("KUBE_BIN_DIR")
	if bins == "" {
		t.Skip("KUBE_BIN_DIR is not set: `make e2e` builds the control plane (test/e2e/kube/build.sh) and sets it")
	}
	o.BinDir, o.Dir = bins, t.TempDir()
	cp, err := e2ekube.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		t.Logf("control plane:\n%s", cp.Logs(20))
		if logs != nil {
			t.Logf("the test's processes:\n%s", tail(logs.String(), 60))
		}
	})
	return cp, bins
}

// startKubeletNode starts the control plane as startControlPlane does and
// a node of it named name, run by a real kubelet over containerd, both
// stopped when the test ends (the node first). The test is skipped where
// this machine cannot run containerd.
func startKubeletNode(ctx context.Context, t *testing.T, name string) (*e2ekube.ControlPlane, *e2ekube.KubeletNode) {
	t.Helper()
	skipWithoutNode(t)
	cp, _ := startControlPlane(ctx, t, nil)
	return cp, startNode(ctx, t, cp, e2ekube.NodeOptions{Name: name})
}

// skipWithoutNode skips the test, saying why, where this machine cannot
// run a kubelet node; it fails it where GPUPOOL_E2E_NODE=required says the
// machine must (CI's, so that the node tests are never skipped there).
func skipWithoutNode(t testing.TB) {
	t.Helper()
	err := e2ekube.CheckCanRunNode()
	switch {
	case err == nil:
	case os.Getenv("GPUPOOL_E2E_NODE") == "required":
		t.Fatalf("no kubelet node on this machine, and GPUPOOL_E2E_NODE=required: %v", err)
	default:
		t.Skipf("no kubelet node on this machine: %v", err)
	}
}

// startNode starts the node o.Name of cp, run by a real kubelet over
// containerd, and stops it when the test ends, before cp. If the test
// fails, its log ends with containerd's and the kubelet's logs.
func startNode(ctx context.Context, t *testing.T, cp *e2ekube.ControlPlane, o e2ekube.NodeOptions) *e2ekube.KubeletNode {
	t.Helper()
	name := o.Name
	start := time.Now()
	node, err := cp.StartNode(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node %s Ready in %v: containerd, the pause image built and imported, the kubelet registered", name, time.Since(start).Round(100*time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("node %s:\n%s", name, node.Logs(30))
		}
		if err := node.Stop(); err != nil {
			t.Errorf("stopping node %s: %v", name, err)
		}
	})
	return node
}

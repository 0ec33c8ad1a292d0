package gpuserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	gpuapi "github.com/gpupool/gpupool/gpuserver/api"
	"github.com/gpupool/gpupool/inventory"
)

// leaseAllocator answers GET /v1/leases/{id} and GET /v1/leases as the
// allocator does: with tokens, a namespace's token sees that namespace's
// leases (others are not found) and an unknown token is 401; without
// tokens (nil), everyone sees everything.
type leaseAllocator struct {
	mu     sync.Mutex
	leases []allocator.Lease
	tokens map[string]string // token -> namespace; "*" for every namespace
}

func (f *leaseAllocator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ns := "*"
	if f.tokens != nil {
		token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		var ok bool
		if ns, ok = f.tokens[token]; !ok {
			api.WriteError(w, http.StatusUnauthorized, &api.Error{Reason: api.ReasonUnauthorized, Message: "missing or unknown bearer token"})
			return
		}
	}
	var visible []allocator.Lease
	for _, l := range f.leases {
		if ns == "*" || l.Namespace == ns {
			visible = append(visible, l)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	if id, ok := strings.CutPrefix(r.URL.Path, "/v1/leases/"); ok {
		for _, l := range visible {
			if l.ID == id {
				_ = json.NewEncoder(w).Encode(api.NewLease(l))
				return
			}
		}
		api.WriteError(w, http.StatusNotFound, &api.Error{Reason: api.ReasonNotFound, Message: "lease " + id + " not found"})
		return
	}
	var out api.LeaseList
	for _, l := range visible {
		if s := r.URL.Query().Get("server"); s == "" || l.Server == s {
			out.Leases = append(out.Leases, api.NewLease(l))
		}
	}
	_ = json.NewEncoder(w).Encode(out)
}

func (f *leaseAllocator) setLeases(leases ...allocator.Lease) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leases = leases
}

// reportRig is a daemon named gpu-a taking reports on a Unix socket, its
// allocator fake, and the socket's path. The test process itself is the
// sender: the kernel tells the daemon its PID.
type reportRig struct {
	d      *Daemon
	alloc  *leaseAllocator
	url    string // the allocator's
	socket string
}

// newReportRig starts the rig; edit adjusts the daemon's Config (the host's
// /proc by default).
func newReportRig(t testing.TB, alloc *leaseAllocator, edit func(*Config)) *reportRig {
	t.Helper()
	as := httptest.NewServer(alloc)
	t.Cleanup(as.Close)
	cl, err := client.New([]string{as.URL}, "server-token")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Inventory: inventory.Server{Name: "gpu-a"}, Client: cl, AllocatorURLs: []string{as.URL},
		Parent: ProcParent("/proc"), StartTime: ProcStartTime("/proc"), Log: slog.New(slog.DiscardHandler),
	}
	if edit != nil {
		edit(&cfg)
	}
	d := New(cfg)
	// A short directory: a socket path has at most 107 bytes.
	dir, err := os.MkdirTemp("", "gpupool")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	socket := filepath.Join(dir, "run", "gpu-a.sock")
	ln, err := ListenProcessSocket(socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := ProcessServer(d)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return &reportRig{d: d, alloc: alloc, url: as.URL, socket: socket}
}

func (r *reportRig) report(token string, rep gpuapi.ProcessReport) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return gpuapi.ReportProcess(ctx, r.socket, token, rep)
}

func (r *reportRig) registered() map[int]string {
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	out := map[int]string{}
	for pid, e := range r.d.pids {
		out[pid] = e.lease
	}
	return out
}

// wantRefusal checks that err is the daemon's refusal with the reason and
// field, naming the value and the limit when it names a field.
func wantRefusal(t *testing.T, err error, reason, field string) {
	t.Helper()
	var e *api.Error
	if !errors.As(err, &e) {
		t.Fatalf("got %v, want a %s refusal", err, reason)
	}
	if e.Reason != reason || e.Field != field || e.Message == "" {
		t.Errorf("refusal %+v: want reason %s, field %q", e, reason, field)
	}
	if field != "" && e.Limit == "" {
		t.Errorf("refusal %+v names no limit", e)
	}
}

var (
	leaseA     = allocator.Lease{ID: "lease-000001", Namespace: "ml", Server: "gpu-a"}
	leaseOther = allocator.Lease{ID: "lease-000002", Namespace: "web", Server: "gpu-a"}
	leaseB     = allocator.Lease{ID: "lease-000003", Namespace: "ml", Server: "gpu-b"}
)

// startChild starts a process the test process is the parent of, holding
// the files given open.
func startChild(t *testing.T, holding ...*os.File) int {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.ExtraFiles = holding
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd.Process.Pid
}

// goneProcess returns a PID no process has.
func goneProcess(t *testing.T) int {
	t.Helper()
	for pid := maxPID; pid > maxPID-1000; pid-- {
		if !running(pid) {
			return pid
		}
	}
	t.Skip("every PID near the maximum is taken")
	return 0
}

// TestProcessReportChecksTheProcess: a sender may report itself (by
// omitting the PID), a child of its own, or, in Kubernetes, a process of
// its own pod; not another's process (the hijack: its use would move to the
// sender's lease and the victim's HPA would be served 0), nor one that does
// not exist.
func TestProcessReportChecksTheProcess(t *testing.T) {
	alloc := &leaseAllocator{leases: []allocator.Lease{leaseA}}
	r := newReportRig(t, alloc, nil)
	self, parent, child := os.Getpid(), os.Getppid(), startChild(t)

	if err := r.report("", gpuapi.ProcessReport{Lease: leaseA.ID}); err != nil {
		t.Fatalf("reporting itself: %v", err)
	}
	if err := r.report("", gpuapi.ProcessReport{PID: child, Lease: leaseA.ID}); err != nil {
		t.Fatalf("reporting its child: %v", err)
	}
	err := r.report("", gpuapi.ProcessReport{PID: parent, Lease: leaseA.ID})
	wantRefusal(t, err, api.ReasonForbidden, "pid")
	err = r.report("", gpuapi.ProcessReport{PID: goneProcess(t), Lease: leaseA.ID})
	wantRefusal(t, err, api.ReasonInvalid, "pid")
	if e := (*api.Error)(nil); errors.As(err, &e) && !strings.Contains(e.Message, "no such process") {
		t.Errorf("a gone process is refused with %q, want it to say no such process", e.Message)
	}
	if got, want := r.registered(), map[int]string{self: leaseA.ID, child: leaseA.ID}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("registered %v, want %v", got, want)
	}

	// In Kubernetes a process speaks for its pod: the parent is in the
	// test's "pod" here.
	pods := newReportRig(t, alloc, func(c *Config) {
		c.PodOf = func(pid int) string {
			if pid == self || pid == parent {
				return "6f1d1c8e-2b4a-4f7e-9a35-0c1d2e3f4a5b"
			}
			return ""
		}
	})
	if err := pods.report("", gpuapi.ProcessReport{PID: parent, Lease: leaseA.ID}); err != nil {
		t.Errorf("reporting a process of its own pod: %v", err)
	}
}

// TestProcessReportChecksTheLease: the lease must be one the sender's
// token may use (the allocator shows it) and on this server.
func TestProcessReportChecksTheLease(t *testing.T) {
	alloc := &leaseAllocator{leases: []allocator.Lease{leaseA, leaseOther, leaseB}, tokens: map[string]string{"ml-token": "ml", "admin": "*"}}
	r := newReportRig(t, alloc, nil)
	for _, c := range []struct {
		name, token, lease string
		reason, field      string
	}{
		{"its own lease", "ml-token", leaseA.ID, "", ""},
		{"an unknown lease", "ml-token", "lease-999999", api.ReasonNotFound, "lease"},
		{"another namespace's lease", "ml-token", leaseOther.ID, api.ReasonNotFound, "lease"},
		{"a lease on another server", "ml-token", leaseB.ID, api.ReasonForbidden, "lease"},
		{"no token", "", leaseA.ID, api.ReasonUnauthorized, ""},
		{"an unknown token", "guess", leaseA.ID, api.ReasonUnauthorized, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := r.report(c.token, gpuapi.ProcessReport{Lease: c.lease})
			if c.reason == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantRefusal(t, err, c.reason, c.field)
		})
	}
	if got := r.registered(); len(got) != 1 || got[os.Getpid()] != leaseA.ID {
		t.Errorf("registered %v, want only the sender under %s", got, leaseA.ID)
	}
}

// TestProcessReportAllocatorDown: when the lease cannot be checked the
// report is refused as unavailable, to retry, not taken on trust.
func TestProcessReportAllocatorDown(t *testing.T) {
	r := newReportRig(t, &leaseAllocator{}, func(c *Config) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		c.AllocatorURLs = []string{"http://" + ln.Addr().String()}
		_ = ln.Close()
	})
	err := r.report("", gpuapi.ProcessReport{Lease: leaseA.ID})
	wantRefusal(t, err, api.ReasonUnavailable, "")
	if got := r.registered(); len(got) != 0 {
		t.Errorf("registered %v without the allocator's word", got)
	}
}

// postRaw sends body as a process report over the socket and returns the
// status and the error body.
func postRaw(t *testing.T, socket string, body []byte) (int, api.Error) {
	t.Helper()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Post("http://gpupool-server/v1/processes", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var e api.Error
	if resp.StatusCode != http.StatusNoContent {
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
			t.Fatalf("%s: the body is not an api.Error: %v", resp.Status, err)
		}
	}
	return resp.StatusCode, e
}

// badReports are bodies the daemon refuses before looking at processes or
// leases, with the status, reason, field and value of the refusal.
var badReports = []struct {
	body                 string
	status               int
	reason, field, value string
}{
	{strings.Repeat(" ", 5<<10) + `{"lease":"lease-000001"}`, 413, api.ReasonRequestTooLarge, "", ""},
	{`{"lease":"lease-000001"} x`, 400, api.ReasonInvalid, "", ""},
	{`{"lease":"lease-000001"}{"lease":"lease-000001"}`, 400, api.ReasonInvalid, "", ""},
	{`{"lease":"lease-000001"}]`, 400, api.ReasonInvalid, "", ""},
	{`not json`, 400, api.ReasonInvalid, "", ""},
	{``, 400, api.ReasonInvalid, "", ""},
	{`{"lease":"lease-000001","pod":"x"}`, 400, api.ReasonInvalid, "pod", ""},
	{`{"pid":"42","lease":"lease-000001"}`, 400, api.ReasonInvalid, "pid", "string"},
	{`{"pid":4.2,"lease":"lease-000001"}`, 400, api.ReasonInvalid, "pid", "number 4.2"},
	{`{"pid":-5,"lease":"lease-000001"}`, 400, api.ReasonInvalid, "pid", "-5"},
	{`{"pid":1,"lease":"lease-000001"}`, 400, api.ReasonInvalid, "pid", "1"},
	{`{"pid":4194305,"lease":"lease-000001"}`, 400, api.ReasonInvalid, "pid", "4194305"},
	{`{"pid":99999999999999999999,"lease":"lease-000001"}`, 400, api.ReasonInvalid, "pid", "number 99999999999999999999"},
	{`{}`, 400, api.ReasonInvalid, "lease", ""},
	{`{"lease":""}`, 400, api.ReasonInvalid, "lease", ""},
	{`{"lease":"../servers/gpu-a"}`, 400, api.ReasonInvalid, "lease", "../servers/gpu-a"},
	{`{"lease":"` + strings.Repeat("a", 65) + `"}`, 400, api.ReasonInvalid, "lease", strings.Repeat("a", 65)},
	{`{"lease":42}`, 400, api.ReasonInvalid, "lease", "number"},
}

// TestProcessReportErrors: every refusal is an api.Error that names the
// field at fault, its value and the limit; an oversized body is 413;
// unknown fields and anything after the object are refused.
func TestProcessReportErrors(t *testing.T) {
	r := newReportRig(t, &leaseAllocator{leases: []allocator.Lease{leaseA}}, nil)
	for _, c := range badReports {
		status, e := postRaw(t, r.socket, []byte(c.body))
		if status != c.status || e.Reason != c.reason || e.Field != c.field || e.Value != c.value || e.Limit == "" || e.Message == "" {
			t.Errorf("%.60q: %d %+v, want %d %s field %q value %q with a limit", c.body, status, e, c.status, c.reason, c.field, c.value)
		}
	}
	if got := r.registered(); len(got) != 0 {
		t.Errorf("bad reports registered %v", got)
	}
	// White space after the object is not more.
	if status, e := postRaw(t, r.socket, []byte("{\"lease\":\"lease-000001\"}\n")); status != http.StatusNoContent {
		t.Errorf("a report ending in a newline: %d %+v", status, e)
	}
}

// TestTCPHandlerTakesNoProcessReports: the TCP port, which any local or
// remote process reaches without telling who it is, takes no reports.
func TestTCPHandlerTakesNoProcessReports(t *testing.T) {
	d := New(Config{Inventory: inventory.Server{Name: "gpu-a"}})
	srv := httptest.NewServer(Handler(d, prometheus.NewRegistry()))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/processes", "application/json", strings.NewReader(`{"pid":4242,"lease":"lease-000001"}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode < 400 || len(d.pids) != 0 {
		t.Errorf("POST /v1/processes over TCP: %s, registry %v", resp.Status, d.pids)
	}
}

// TestProcessRegistryBoundedAndPruned: a lease may hold maxPIDsPerLease
// processes and the server maxPIDs; a full registry makes room by dropping
// gone processes; every lease refresh drops gone processes and the
// processes of gone leases; a PID has one entry.
func TestProcessRegistryBoundedAndPruned(t *testing.T) {
	var mu sync.Mutex
	gone := map[int]bool{}
	now := time.Unix(1.8e9, 0)
	alloc := &leaseAllocator{}
	r := newReportRig(t, alloc, func(c *Config) {
		// Made-up PIDs, each started at 1 until it is gone.
		c.StartTime = func(pid int) (uint64, bool) { mu.Lock(); defer mu.Unlock(); return 1, !gone[pid] }
		c.Clock = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	})
	d := r.d
	lease := func(i int) string { return fmt.Sprintf("lease-%06d", i) }
	pid := 1000
	for l := range maxPIDs / maxPIDsPerLease {
		for range maxPIDsPerLease {
			if err := d.RegisterPID(pid, lease(l)); err != nil {
				t.Fatalf("registering PID %d of %s: %v", pid, lease(l), err)
			}
			pid++
		}
	}
	var full *registryFullError
	if err := d.RegisterPID(pid, lease(0)); !errors.As(err, &full) || !strings.Contains(full.limit, "per lease") {
		t.Errorf("a %dth process of one lease: %v, want refused by the per-lease cap", maxPIDsPerLease+1, err)
	}
	if err := d.RegisterPID(pid, lease(9999)); !errors.As(err, &full) || !strings.Contains(full.limit, "on this server") {
		t.Errorf("a %dth process: %v, want refused by the total cap", maxPIDs+1, err)
	}
	if err := d.RegisterPID(1000, lease(9999)); err != nil || len(r.registered()) != maxPIDs {
		t.Errorf("reporting a registered PID again under another lease: %v, %d entries; want it moved, %d entries", err, len(r.registered()), maxPIDs)
	}
	mu.Lock()
	gone[1001] = true
	mu.Unlock()
	if err := d.RegisterPID(pid, lease(9999)); err != nil {
		t.Errorf("a full registry with a gone process: %v, want it replaced", err)
	}

	// A refresh keeps the processes of live leases that still run.
	alloc.setLeases(allocator.Lease{ID: lease(1), Namespace: "ml", Server: "gpu-a"})
	mu.Lock()
	gone[1000+maxPIDsPerLease] = true // lease 1's first
	now = now.Add(time.Second)
	mu.Unlock()
	d.refreshLeases(context.Background())
	got := r.registered()
	if len(got) != maxPIDsPerLease-1 {
		t.Errorf("after the refresh %d entries, want lease-000001's %d running processes", len(got), maxPIDsPerLease-1)
	}
	for p, l := range got {
		if l != lease(1) || p == 1000+maxPIDsPerLease {
			t.Errorf("after the refresh PID %d of %s is still registered", p, l)
		}
	}
}

// TestPodCacheBounded: the PodOf cache never holds more than maxPIDs PIDs,
// however many processes come and go between lease refreshes.
func TestPodCacheBounded(t *testing.T) {
	calls := 0
	d := New(Config{PodOf: func(int) string { calls++; return "" }})
	for pid := range 3 * maxPIDs {
		d.podOf(pid + 2)
		if len(d.pods) > maxPIDs {
			t.Fatalf("after %d PIDs the cache holds %d", pid+1, len(d.pods))
		}
	}
	if d.podOf(3*maxPIDs + 1); calls != 3*maxPIDs {
		t.Errorf("PodOf called %d times for %d PIDs, want the last one cached", calls, 3*maxPIDs)
	}
}

// TestListenProcessSocket: the socket lets every local user connect,
// replaces one no daemon answers on, refuses one a daemon answers on (and
// a file that is no socket), and goes when its listener closes.
func TestListenProcessSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "gpupool")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	path := filepath.Join(dir, "gpu-a.sock")
	stale, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false) // as a killed daemon leaves it
	_ = stale.Close()

	ln, err := ListenProcessSocket(path)
	if err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm()&0o666 != 0o666 {
		t.Errorf("socket mode %v (%v), want every user to read and write it", fi.Mode(), err)
	}
	if second, err := ListenProcessSocket(path); err == nil {
		_ = second.Close()
		t.Error("a second daemon took the socket of a running one")
	}
	_ = ln.Close()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("the socket is still there after its listener closed: %v", err)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if ln, err := ListenProcessSocket(file); err == nil {
		_ = ln.Close()
		t.Error("a regular file was replaced by the socket")
	}
}

// FuzzProcessReport decodes arbitrary bodies as the daemon does: it never
// panics, a refusal is a 400 or 413 api.Error that names the limit (and the
// value, when it names a field), and what it accepts is within every limit.
func FuzzProcessReport(f *testing.F) {
	f.Add([]byte(`{"lease":"lease-000001"}`))
	f.Add([]byte(`{"pid":4242,"lease":"lease-000001"}` + "\n"))
	for _, c := range badReports {
		f.Add([]byte(c.body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		rep, ref := parseReport(http.MaxBytesReader(nil, io.NopCloser(bytes.NewReader(body)), maxReportBody))
		if ref != nil {
			e := ref.body
			switch {
			case ref.status != http.StatusBadRequest && ref.status != http.StatusRequestEntityTooLarge,
				e.Reason == "" || e.Message == "" || e.Limit == "",
				(ref.status == http.StatusRequestEntityTooLarge) != (e.Reason == api.ReasonRequestTooLarge):
				t.Fatalf("refusal %d %+v does not name its reason and limit", ref.status, e)
			}
			return
		}
		if rep.PID < 0 || rep.PID == 1 || rep.PID > maxPID || !validLeaseID(rep.Lease) || len(body) > maxReportBody {
			t.Fatalf("accepted %+v from %q", rep, body)
		}
	})
}

// BenchmarkProcessReports sends process reports over the socket, a new
// connection each, half of them for a process that does not exist, and
// reports how much the process's resident memory grew (with 20000x, the
// flood that once grew the daemon by 188 MiB) and what the registry holds.
func BenchmarkProcessReports(b *testing.B) {
	r := newReportRig(b, &leaseAllocator{leases: []allocator.Lease{leaseA}}, nil)
	gone := maxPID
	for running(gone) {
		gone--
	}
	runtime.GC()
	before := residentBytes(b)
	b.ResetTimer()
	for i := range b.N {
		rep := gpuapi.ProcessReport{Lease: leaseA.ID}
		if i%2 == 1 {
			rep.PID = gone
		}
		if err := r.report("", rep); (err == nil) != (rep.PID == 0) {
			b.Fatalf("report %+v: %v", rep, err)
		}
	}
	b.StopTimer()
	runtime.GC()
	b.ReportMetric(float64(residentBytes(b)-before)/(1<<20), "rss-growth-MiB")
	b.ReportMetric(float64(len(r.registered())), "registered")
}

// residentBytes is the process's resident set (VmRSS).
func residentBytes(t testing.TB) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// running reports whether a process with pid exists here.
func running(pid int) bool {
	_, ok := ProcStartTime("/proc")(pid)
	return ok
}

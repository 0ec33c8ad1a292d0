package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/heapprofiler"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/gpupool/gpupool/allocator/api"
)

// TestConsoleInABrowser opens the pool console (GET /console/) in a real
// headless Chromium against the allocator binary, three gpupool-server
// daemons on simulated GPUs that report their use in heartbeats, leases of
// two namespaces and two requests waiting. It checks what a user sees
// against the API the page reads, /v1/console, fetched with the same token:
// nothing without a token or with a wrong one, each panel's numbers for
// the admin, a new lease and a dead server within seconds, only its own
// namespace for a tenant's token, a page that fits a phone, and a page
// that does not grow when left open. It logs the page's weight, its first
// render and its heap, and saves screenshots (GPUPOOL_ARTIFACTS, else
// bin/artifacts/console).
func TestConsoleInABrowser(t *testing.T) {
	exe := findChromium(t)
	p := startConsolePool(t)
	artifacts := consoleArtifacts(t)
	chrome := startBrowser(t, exe)

	// The first tab: a user who opens the console and signs in.
	tab := chrome
	do(t, tab, chromedp.Navigate(p.a.URL+"/console/"))

	t.Run("signed out", func(t *testing.T) {
		// Give the page a poll's time: it must not fetch and show data
		// without a token.
		time.Sleep(1200 * time.Millisecond)
		d := readConsole(t, tab)
		if !d.Login || d.Console || d.rows() != 0 {
			t.Errorf("without a token: login shown %v, data area shown %v, %d data rows; want the login form alone", d.Login, d.Console, d.rows())
		}
		screenshot(t, tab, artifacts, "signed-out.png")

		do(t, tab, chromedp.SendKeys(chromedp.ID("token"), "not-a-token"), chromedp.Click(chromedp.ID("signin")))
		waitPage(t, tab, 5*time.Second, "#login-error shown", loginErrorShown)
		if d := readConsole(t, tab); !d.Login || !d.LoginError || d.Console || d.rows() != 0 {
			t.Errorf("with a wrong token: login shown %v, data area shown %v, %d data rows; want the login form and its error alone", d.Login, d.Console, d.rows())
		}
		screenshot(t, tab, artifacts, "wrong-token.png")
	})
	for _, token := range []string{"", "not-a-token"} {
		if code, e := consoleStatus(t, p.a.URL, token); code != http.StatusUnauthorized || e.Reason != api.ReasonUnauthorized {
			t.Errorf("GET /v1/console with token %q: %d, reason %q; want 401 and %q", token, code, e.Reason, api.ReasonUnauthorized)
		}
	}

	// What follows needs a signed-in page.
	signIn(t, tab, p.config.Admin)
	t.Run("admin", func(t *testing.T) {
		if d := readConsole(t, tab); d.Login || !d.Console || !strings.Contains(d.Viewer, "admin") {
			t.Errorf("signed in as admin: login shown %v, data area shown %v, viewer %q", d.Login, d.Console, d.Viewer)
		}
		// The API itself, or the page would be compared with nothing.
		v := consoleView(t, p.a.URL, p.config.Admin)
		var waiting []string
		for _, w := range v.Pending {
			waiting = append(waiting, w.Namespace+" "+w.Reason)
		}
		slices.Sort(waiting)
		if len(v.Servers) != 3 || len(v.Models) != 1 || v.Models[0].GPUs != 6 || len(v.Leases) != len(p.leases) ||
			len(v.Tenants) != 2 || !slices.Equal(waiting, []string{"ml quota", "team-b capacity"}) {
			t.Errorf("/v1/console for the admin: %d servers, models %+v, %d leases, %d tenants, waiting %q; want 3, 6 H100s, %d, 2, ml for quota and team-b for capacity",
				len(v.Servers), v.Models, len(v.Leases), len(v.Tenants), waiting, len(p.leases))
		}
		p.checkPanels(t, tab, p.config.Admin)
		screenshot(t, tab, artifacts, "admin.png")
		for _, panel := range []string{"overview", "servers", "fragmentation", "tenants", "leases", "pending", "history"} {
			shot, err := run(tab, chromedp.Screenshot(chromedp.ID(panel)))
			if err != nil {
				t.Errorf("screenshot of #%s: %v", panel, err)
				continue
			}
			save(t, artifacts, "admin-"+panel+".png", shot)
		}
	})

	// A second tab in a browser context of its own (its own renderer, so
	// its own heap), signed in and left open while the rest runs: it
	// measures the page's weight, its first render and its heap.
	idle := measureLoad(t, chrome, p.a.URL, p.config.Admin)

	t.Run("leases table", func(t *testing.T) { p.checkLeasesTable(t, tab) })

	t.Run("new lease", func(t *testing.T) {
		l := p.acquire(t, "ml", api.AcquireRequest{GPUAmount: 1, GPUPercent: 25, Owner: owner("trainer-2", "trainer")})
		acquired := time.Now()
		v := consoleView(t, p.a.URL, p.config.Admin)
		waitPage(t, tab, 3*time.Second, "lease "+l.ID+"'s row", fmt.Sprintf(`!!document.querySelector('#leases tr[data-lease=%q]')`, l.ID))
		t.Logf("lease %s shown %v after it was granted", l.ID, time.Since(acquired).Round(10*time.Millisecond))
		waitRendered(t, tab, v.At)
		p.checkPanels(t, tab, p.config.Admin)
	})

	t.Run("server dies", func(t *testing.T) {
		const victim = "sim-2"
		if err := p.daemons[victim].Process.Kill(); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		waitPage(t, tab, 15*time.Second, victim+" unhealthy",
			fmt.Sprintf(`document.querySelector('#servers div.server[data-server=%q]')?.classList.contains('unhealthy') === true`, victim))
		t.Logf("%s shown unhealthy %v after its daemon was killed (heartbeat timeout 3s)", victim, time.Since(killed).Round(10*time.Millisecond))
		if d := readConsole(t, tab); len(d.unhealthy()) != 1 {
			t.Errorf("unhealthy servers %v, want only %s", d.unhealthy(), victim)
		}
		p.checkPanels(t, tab, p.config.Admin)
		screenshot(t, tab, artifacts, "server-down.png")
	})

	t.Run("widths", func(t *testing.T) {
		for _, w := range []struct {
			name          string
			width, height int64
		}{{"phone", 390, 844}, {"desktop", 1280, 800}} {
			do(t, tab, chromedp.EmulateViewport(w.width, w.height))
			time.Sleep(300 * time.Millisecond) // a layout and a paint
			var fit struct {
				ScrollWidth, InnerWidth int
				Leases                  bool
			}
			pageJSON(t, tab, `JSON.stringify({scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth,
				leases: document.querySelector('#leases')?.checkVisibility() === true})`, &fit)
			if fit.InnerWidth != int(w.width) {
				t.Errorf("%s: innerWidth %d, want %d", w.name, fit.InnerWidth, w.width)
			}
			if fit.ScrollWidth > fit.InnerWidth+1 {
				t.Errorf("%s: the page is %d px wide in a %d px window: it scrolls sideways", w.name, fit.ScrollWidth, fit.InnerWidth)
			}
			if !fit.Leases {
				t.Errorf("%s: #leases is not visible", w.name)
			}
			screenshot(t, tab, artifacts, "admin-"+w.name+".png")
		}
	})

	t.Run("tenant", func(t *testing.T) {
		// A new browser context: nothing of the admin's session, its
		// sessionStorage included.
		tenant := newTab(t, chrome)
		do(t, tenant, chromedp.Navigate(p.a.URL+"/console/"))
		signIn(t, tenant, p.config.Tenant["team-b"])
		d := readConsole(t, tenant)
		if !strings.Contains(d.Viewer, "team-b") || strings.Contains(d.Viewer, "admin") {
			t.Errorf("#viewer says %q, want team-b", d.Viewer)
		}
		v := consoleView(t, p.a.URL, p.config.Tenant["team-b"])
		for _, l := range p.leases {
			if l.Namespace == "team-b" {
				continue
			}
			if slices.ContainsFunc(v.Leases, func(c api.ConsoleLease) bool { return c.ID == l.ID }) {
				t.Errorf("/v1/console with team-b's token lists %s's lease %s", l.Namespace, l.ID)
			}
			if slices.ContainsFunc(d.Leases, func(r domLease) bool { return r.ID == l.ID }) {
				t.Errorf("team-b's page shows %s's lease %s", l.Namespace, l.ID)
			}
		}
		for _, r := range d.Pending {
			if r.Namespace != "team-b" {
				t.Errorf("team-b's page shows a request waiting in %s", r.Namespace)
			}
		}
		for _, r := range d.Tenants {
			if r.Namespace != "team-b" {
				t.Errorf("team-b's page shows tenant %s", r.Namespace)
			}
		}
		if len(v.Leases) != 2 || len(v.Pending) != 1 {
			t.Errorf("/v1/console with team-b's token: %d leases, %d waiting; want team-b's 2 and 1", len(v.Leases), len(v.Pending))
		}
		if v.Namespace != "team-b" || slices.ContainsFunc(v.Pending, func(w api.ConsolePending) bool { return w.Namespace != "team-b" }) ||
			slices.ContainsFunc(v.Tenants, func(n api.ConsoleTenant) bool { return n.Namespace != "team-b" }) {
			t.Errorf("/v1/console with team-b's token: namespace %q, pending %+v, tenants %+v; want team-b's alone", v.Namespace, v.Pending, v.Tenants)
		}
		p.checkPanels(t, tenant, p.config.Tenant["team-b"])
		screenshot(t, tenant, artifacts, "team-b.png")
	})

	t.Run("left open", func(t *testing.T) { idle.check(t) })
}

// consolePool is the pool the console shows.
type consolePool struct {
	a       *allocatorProcess
	config  *poolConfig
	daemons map[string]*exec.Cmd
	// leases are the leases the test took, oldest first.
	leases []api.Lease
}

// startConsolePool starts the allocator (a server silent for 3 s is
// unschedulable) and three daemons of 2 simulated H100s each heartbeating
// every second, takes four leases in ml and team-b, two of them
// fractional, and queues one request of each namespace that cannot be
// granted: ml's over its quota of 4 GPUs, team-b's 3 GPUs that no server
// has.
func startConsolePool(t *testing.T) *consolePool {
	t.Helper()
	p := &consolePool{config: writePoolConfig(t, map[string]int64{"ml": 400, "team-b": 800}), daemons: map[string]*exec.Cmd{}}
	p.a = startAllocator(t, "--data-dir", t.TempDir(), "--config", p.config.Path, "--heartbeat-timeout", "3s")
	logs := &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("allocator:\n%s\ndaemons:\n%s", tail(p.a.logs.String(), 30), tail(logs.String(), 40))
		}
	})
	// The trainers use some of their share, so that use is not all zeros.
	workload := filepath.Join(t.TempDir(), "workload.yaml")
	if err := os.WriteFile(workload, []byte("- {namespace: ml, selector: app=trainer, gpus: 0.3}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		name := fmt.Sprint("sim-", i)
		p.daemons[name] = startDaemon(t, logs, p.config.Servers, "--allocator", p.a.URL, "--name", name,
			"--listen", "127.0.0.1:0", "--probe-listen", "127.0.0.1:0", "--simulate-gpus", "H100:80Gi:2",
			"--simulated-workload", workload, "--metric-labels-allowlist", "app", "--interval", "500ms", "--heartbeat", "1s")
	}
	admin := newClient(t, p.a.URL, p.config.Admin)
	waitFor(t, func() bool { s, err := admin.Pool(context.Background()); return err == nil && len(s.Servers) == 3 })

	// The 2-GPU lease first, while every server has 2 free.
	p.acquire(t, "team-b", api.AcquireRequest{GPUAmount: 2, Owner: owner("infer-1", "infer")})
	p.acquire(t, "ml", api.AcquireRequest{GPUAmount: 1, Owner: owner("trainer-1", "trainer")})
	p.acquire(t, "ml", api.AcquireRequest{GPUAmount: 1, GPUPercent: 50, Owner: owner("trainer-0", "trainer")})
	p.acquire(t, "team-b", api.AcquireRequest{GPUAmount: 1, GPUPercent: 25, Owner: owner("infer-0", "infer")})

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for ns, gpus := range map[string]int{"ml": 4, "team-b": 3} {
		c := newClient(t, p.a.URL, p.config.Tenant[ns])
		wg.Go(func() {
			_, err := c.Acquire(ctx, api.AcquireRequest{Namespace: ns, GPUAmount: gpus, UntilReleased: true, Wait: "10m",
				Owner: owner(ns+"-waiting", "waiting")})
			if ctx.Err() == nil {
				t.Errorf("the request of %d GPUs in %s that should wait: %v", gpus, ns, err)
			}
		})
	}
	waitFor(t, func() bool { return len(consoleView(t, p.a.URL, p.config.Admin).Pending) == 2 })
	return p
}

// acquire takes an until-released lease with ns's token: nothing expires
// while the test compares the page with the API.
func (p *consolePool) acquire(t *testing.T, ns string, r api.AcquireRequest) api.Lease {
	t.Helper()
	r.Namespace, r.UntilReleased = ns, true
	l, err := newClient(t, p.a.URL, p.config.Tenant[ns]).Acquire(context.Background(), r)
	if err != nil {
		t.Fatalf("acquire %+v in %s: %v", r, ns, err)
	}
	p.leases = append(p.leases, l)
	return l
}

func owner(pod, app string) api.Owner {
	return api.Owner{Pod: pod, UID: "uid-" + pod, Labels: map[string]string{"app": app}}
}

// consoleView is GET /v1/console with token.
func consoleView(t testing.TB, url, token string) api.Console {
	t.Helper()
	v, err := newClient(t, url, token).Console(context.Background())
	if err != nil {
		t.Fatalf("GET /v1/console: %v", err)
	}
	return v
}

// consoleStatus is GET /v1/console's status and error with token, none
// when empty.
func consoleStatus(t testing.TB, url, token string) (int, api.Error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url+"/v1/console", nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var e api.Error
	_ = json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, e
}

// checkPanels compares every panel of the page with /v1/console seen with
// token. The page shows the view of its last poll and the API answers a
// later one, so they are compared until they agree, for a few polls: what
// the test did not change (shares, counts, health, leases, the waiting)
// must agree, and what the daemons measure (use) moves on its own, so
// only its format is checked.
func (p *consolePool) checkPanels(t *testing.T, tab context.Context, token string) {
	t.Helper()
	var diffs []string
	for deadline := time.Now().Add(4 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		d := readConsole(t, tab)
		v := consoleView(t, p.a.URL, token)
		if diffs = diffConsole(d, v); len(diffs) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(diffs) > 0 {
		t.Errorf("the page does not show /v1/console:\n%s", strings.Join(diffs, "\n"))
	}
}

var (
	twoDecimals = regexp.MustCompile(`^-?[0-9]+\.[0-9]{2}$`)
	percent     = regexp.MustCompile(`^([0-9]+)?$`)
)

// diffConsole lists where the page's panels differ from the view v.
func diffConsole(d consoleDOM, v api.Console) []string {
	var diffs []string
	differ := func(format string, args ...any) { diffs = append(diffs, fmt.Sprintf(format, args...)) }
	// share checks a share written with 2 decimals; the page may round a
	// half up where Go rounds it to even, hence the half cent.
	share := func(what, got string, want float64) {
		if f, err := strconv.ParseFloat(got, 64); !twoDecimals.MatchString(got) || err != nil || math.Abs(f-want) > 0.0051 {
			differ("%s: %q, want %.2f", what, got, want)
		}
	}
	measured := func(what, got string) {
		if !twoDecimals.MatchString(got) {
			differ("%s: %q, want a share with 2 decimals", what, got)
		}
	}
	count := func(what, got string, want int) {
		if got != strconv.Itoa(want) {
			differ("%s: %q, want %d", what, got, want)
		}
	}

	if len(d.Models) != len(v.Models) {
		differ("overview: %d models, want %d", len(d.Models), len(v.Models))
	}
	for _, m := range v.Models {
		r, ok := rowOf(differ, "overview", d.Models, func(r domModel) string { return r.Model }, m.Model)
		if !ok {
			continue
		}
		what := "overview " + m.Model
		count(what+" gpus", r.GPUs, m.GPUs)
		count(what+" healthy", r.Healthy, m.Healthy)
		share(what+" leased", r.Leased, m.LeasedGPUs)
		measured(what+" used", r.Used)
		measured(what+" idle", r.Idle)
		share(what+" free", r.Free, m.FreeGPUs)
		share(what+" pending", r.Pending, m.PendingGPUs)
	}

	if len(d.Servers) != len(v.Servers) {
		differ("servers: %d, want %d", len(d.Servers), len(v.Servers))
	}
	for _, s := range v.Servers {
		r, ok := rowOf(differ, "servers", d.Servers, func(r domServer) string { return r.Name }, s.Name)
		if !ok {
			continue
		}
		if r.Unhealthy == s.Healthy {
			differ("server %s: class unhealthy %v, API healthy %v", s.Name, r.Unhealthy, s.Healthy)
		}
		if len(r.GPUs) != len(s.GPUs) {
			differ("server %s: %d GPUs, want %d", s.Name, len(r.GPUs), len(s.GPUs))
		}
		for _, g := range s.GPUs {
			id := fmt.Sprintf("%s/%d", s.Name, g.Index)
			j := slices.IndexFunc(r.GPUs, func(x domGPU) bool { return x.ID == id })
			if j < 0 {
				differ("server %s: no GPU %s", s.Name, id)
				continue
			}
			share("GPU "+id+" data-leased", r.GPUs[j].Leased, g.LeasedPercent)
			if !percent.MatchString(r.GPUs[j].Util) || g.Utilization != nil && r.GPUs[j].Util == "" {
				differ("GPU %s data-util: %q, want a whole percent, or nothing while its use is unknown (API: %v)", id, r.GPUs[j].Util, g.Utilization)
			}
		}
		if f, ok := rowOf(differ, "fragmentation", d.Frag, func(x domFrag) string { return x.Server }, s.Name); ok {
			share("fragmentation "+s.Name, f.Frag, s.FragmentationGPUs)
		}
	}
	share("#frag-total", d.FragTotal, v.FragmentationGPUs)

	if len(d.Tenants) != len(v.Tenants) {
		differ("tenants: %d rows, want %d", len(d.Tenants), len(v.Tenants))
	}
	for _, n := range v.Tenants {
		r, ok := rowOf(differ, "tenants", d.Tenants, func(r domTenant) string { return r.Namespace }, n.Namespace)
		if !ok {
			continue
		}
		what := "tenant " + n.Namespace
		share(what+" hard", r.Hard, n.HardGPUs)
		share(what+" quota used", r.QuotaUsed, n.QuotaUsedGPUs)
		count(what+" leases", r.Leases, n.Leases)
		count(what+" pods", r.Pods, n.Pods)
		share(what+" leased", r.Leased, n.LeasedGPUs)
		measured(what+" used", r.Used)
	}

	if got, want := d.leaseIDs(), leaseIDs(v.Leases); !slices.Equal(got, want) {
		differ("leases: rows %v, want %v", got, want)
	}
	for _, l := range v.Leases {
		i := slices.IndexFunc(d.Leases, func(r domLease) bool { return r.ID == l.ID })
		if i < 0 {
			continue // told above
		}
		r, what := d.Leases[i], "lease "+l.ID
		if r.Namespace != l.Namespace || r.Pod != l.Pod || !strings.Contains(r.Server, l.Server) {
			differ("%s: namespace, pod, server %q %q %q, want %q %q %q", what, r.Namespace, r.Pod, r.Server, l.Namespace, l.Pod, l.Server)
		}
		if r.Link != "#server-"+l.Server || !r.LinkTarget {
			differ("%s: its server links to %q (a target on the page: %v), want #server-%s", what, r.Link, r.LinkTarget, l.Server)
		}
		share(what+" share", r.Share, l.ShareGPUs)
	}

	var got, want []string
	for _, r := range d.Pending {
		got = append(got, r.Namespace+" "+r.Reason)
	}
	for _, w := range v.Pending {
		want = append(want, w.Namespace+" "+w.Reason)
		if !slices.Contains([]string{api.WaitCapacity, api.WaitQuota, api.WaitModel, api.WaitTopology}, w.Reason) {
			differ("/v1/console: a request of %s waits for %q, not one of the reasons", w.Namespace, w.Reason)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		differ("pending: %q, want %q", got, want)
	}

	if len(d.Dangling) > 0 {
		differ("links to nothing on the page: %q", d.Dangling)
	}
	if !d.History.Leased || !d.History.Used {
		differ("history: polyline.leased %v, polyline.used %v; want both", d.History.Leased, d.History.Used)
	}
	return diffs
}

// rowOf is the page's row of a panel whose key is want; a missing row is
// a difference.
func rowOf[R any](differ func(string, ...any), panel string, rows []R, key func(R) string, want string) (R, bool) {
	i := slices.IndexFunc(rows, func(r R) bool { return key(r) == want })
	if i < 0 {
		differ("%s: no row for %s", panel, want)
		var none R
		return none, false
	}
	return rows[i], true
}

func leaseIDs(ls []api.ConsoleLease) []string {
	var ids []string
	for _, l := range ls {
		ids = append(ids, l.ID)
	}
	slices.Sort(ids)
	return ids
}

// checkLeasesTable uses the leases table: the filter, the sort by each
// column, the links to servers and the CSV.
func (p *consolePool) checkLeasesTable(t *testing.T, tab context.Context) {
	v := consoleView(t, p.a.URL, p.config.Admin)

	// Filter on team-b: only its leases stay shown, across a poll too.
	do(t, tab, chromedp.SendKeys(chromedp.ID("lease-filter"), "team-b"))
	for range 2 {
		var shown []string
		for _, r := range readConsole(t, tab).Leases {
			if r.Shown {
				shown = append(shown, r.ID)
			}
		}
		slices.Sort(shown)
		var want []string
		for _, l := range v.Leases {
			if l.Namespace == "team-b" {
				want = append(want, l.ID)
			}
		}
		if slices.Sort(want); !slices.Equal(shown, want) {
			t.Errorf("filtered on team-b, rows shown %v, want team-b's %v", shown, want)
		}
		time.Sleep(1200 * time.Millisecond)
	}
	pageJSON(t, tab, `(() => { const f = document.querySelector('#lease-filter'); f.value = '';
		f.dispatchEvent(new Event('input', {bubbles: true})); return '{}' })()`, &struct{}{})

	// Sort by each column the table offers: a click orders its cells, and
	// the order holds when the next poll redraws the table.
	var keys []string
	pageJSON(t, tab, `JSON.stringify([...document.querySelectorAll('#leases th[data-sort]')].map(th => th.dataset.sort))`, &keys)
	if len(keys) == 0 {
		t.Error("#leases has no th[data-sort]")
	}
	for _, key := range keys {
		if !slices.Contains([]string{"namespace", "pod", "server", "share"}, key) {
			continue // a column whose cells the contract does not name
		}
		do(t, tab, chromedp.Click(chromedp.CSS(fmt.Sprintf(`#leases th[data-sort=%q]`, key))))
		for _, when := range []string{"after the click", "after a poll"} {
			if when == "after a poll" {
				time.Sleep(1200 * time.Millisecond)
			}
			var cells []string
			cell := "td." + key
			if key == "server" {
				cell = "td.server a" // its first link; the cell goes on with the lease's GPUs
			}
			pageJSON(t, tab, fmt.Sprintf(`JSON.stringify([...document.querySelectorAll('#leases tr[data-lease]')].map(r => r.querySelector(%q)?.textContent.trim()))`, cell), &cells)
			if !ordered(cells, key == "share") {
				t.Errorf("sorted by %s %s, the column reads %q", key, when, cells)
			}
		}
	}

	// The CSV is downloaded as a user does, by a click: the page's policy
	// lets it fetch nothing but the API, a blob: URL included.
	downloads := t.TempDir()
	ctx, cancel := context.WithTimeout(tab, pageTimeout)
	defer cancel()
	if _, err := chromedp.CallBrowser(ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
		Behavior: browser.SetDownloadBehaviorBehaviorAllow, DownloadPath: downloads}); err != nil {
		t.Fatal(err)
	}
	do(t, tab, chromedp.Click(chromedp.ID("csv")))
	var csv []byte
	waitFor(t, func() bool { // Chromium renames the file once it is whole
		var err error
		csv, err = os.ReadFile(filepath.Join(downloads, "leases.csv"))
		return err == nil
	})
	for _, l := range v.Leases {
		if !strings.Contains(string(csv), l.ID) {
			t.Errorf("the CSV has no lease %s:\n%s", l.ID, csv)
		}
	}
	// A cell a spreadsheet would run is text, as OWASP advises: a leading
	// ' before = + - @, a tab or a carriage return, and the cell quoted.
	cells := map[string]string{}
	pageJSON(t, tab, `JSON.stringify(Object.fromEntries(["=HYPERLINK(\"http://x\",\"y\")", "+1", "-1+1", "@SUM(A1)", "\t=1+1", "\r=1", "lease-000001", "a,b"].map(s => [s, csvCell(s)])))`, &cells)
	for in, want := range map[string]string{
		`=HYPERLINK("http://x","y")`: `"'=HYPERLINK(""http://x"",""y"")"`, "+1": `"'+1"`, "-1+1": `"'-1+1"`, "@SUM(A1)": `"'@SUM(A1)"`,
		"\t=1+1": "\"'\t=1+1\"", "\r=1": "\"'\r=1\"", "lease-000001": "lease-000001", "a,b": `"a,b"`,
	} {
		if cells[in] != want {
			t.Errorf("csvCell(%q) = %q, want %q", in, cells[in], want)
		}
	}
}

// ordered reports whether cells are sorted one way or the other, as
// numbers or as text.
func ordered(cells []string, numbers bool) bool {
	compare := func(a, b string) int {
		if numbers {
			x, _ := strconv.ParseFloat(a, 64)
			y, _ := strconv.ParseFloat(b, 64)
			return cmp.Compare(x, y)
		}
		return strings.Compare(strings.ToLower(a), strings.ToLower(b))
	}
	return slices.IsSortedFunc(cells, compare) || slices.IsSortedFunc(cells, func(a, b string) int { return compare(b, a) })
}

// consoleDOM is what the page shows, read through the DOM contract's
// selectors.
type consoleDOM struct {
	At                string
	Viewer            string
	Login, LoginError bool
	Console           bool
	DataRows          int
	Models            []domModel
	Servers           []domServer
	FragTotal         string
	Frag              []domFrag
	Tenants           []domTenant
	Leases            []domLease
	Pending           []domPending
	History           struct{ Leased, Used bool }
	// Dangling are the page's links to an element it does not have.
	Dangling []string
}

type (
	domModel struct {
		Model, GPUs, Healthy, Leased, Used, Idle, Free, Pending string
	}
	domServer struct {
		Name      string
		Unhealthy bool
		GPUs      []domGPU
	}
	domGPU    struct{ ID, Leased, Util string }
	domFrag   struct{ Server, Frag string }
	domTenant struct {
		Namespace, Hard, QuotaUsed, Leases, Pods, Leased, Used string
	}
	domLease struct {
		ID, Namespace, Pod, Server, Link, Share string
		Shown, LinkTarget                       bool
	}
	domPending struct{ Namespace, Reason string }
)

// rows counts the data rows anywhere in the page.
func (d consoleDOM) rows() int { return d.DataRows }

func (d consoleDOM) leaseIDs() []string {
	var ids []string
	for _, l := range d.Leases {
		ids = append(ids, l.ID)
	}
	slices.Sort(ids)
	return ids
}

func (d consoleDOM) unhealthy() []string {
	var names []string
	for _, s := range d.Servers {
		if s.Unhealthy {
			names = append(names, s.Name)
		}
	}
	return names
}

// readConsoleJS reads the page through the DOM contract's selectors into
// consoleDOM's JSON. A cell that is missing reads null, which differs
// from every number.
var readConsoleJS = strings.ReplaceAll(`(() => {
	const one = (el, s) => el.querySelector(s);
	const all = (el, s) => [...el.querySelectorAll(s)];
	const text = (el, s) => { const e = one(el, s); return e ? e.textContent.trim() : null; };
	const shown = s => one(document, s)?.checkVisibility() === true;
	return JSON.stringify({
		at: document.body.getAttribute('data-at') || '',
		viewer: one(document, '#viewer')?.textContent.trim() || '',
		login: shown('#login'), loginError: ${loginErrorShown}, console: shown('#console'),
		dataRows: all(document, 'tr[data-model], div.server, tr[data-namespace], tr[data-lease], tr[data-pending]').length,
		models: all(document, '#overview tr[data-model]').map(r => ({model: r.dataset.model, gpus: text(r, 'td.gpus'),
			healthy: text(r, 'td.healthy'), leased: text(r, 'td.leased'), used: text(r, 'td.used'), idle: text(r, 'td.idle'),
			free: text(r, 'td.free'), pending: text(r, 'td.pending')})),
		servers: all(document, '#servers div.server').map(s => ({name: s.dataset.server, unhealthy: s.classList.contains('unhealthy'),
			gpus: all(s, 'div.gpu').map(g => ({id: g.dataset.gpu, leased: g.getAttribute('data-leased'), util: g.getAttribute('data-util')}))})),
		fragTotal: text(document, '#frag-total'),
		frag: all(document, '#fragmentation tr[data-server]').map(r => ({server: r.dataset.server, frag: text(r, 'td.frag')})),
		tenants: all(document, '#tenants tr[data-namespace]').map(r => ({namespace: r.dataset.namespace, hard: text(r, 'td.hard'),
			quotaUsed: text(r, 'td.quota-used'), leases: text(r, 'td.leases'), pods: text(r, 'td.pods'), leased: text(r, 'td.leased'),
			used: text(r, 'td.used')})),
		leases: all(document, '#leases tr[data-lease]').map(r => ({id: r.dataset.lease, namespace: text(r, 'td.namespace'),
			pod: text(r, 'td.pod'), server: text(r, 'td.server'), link: one(r, 'td.server a')?.getAttribute('href') || '',
			linkTarget: !!document.getElementById((one(r, 'td.server a')?.getAttribute('href') || '#').slice(1)),
			share: text(r, 'td.share'), shown: r.checkVisibility()})),
		pending: all(document, '#pending tr[data-pending]').map(r => ({namespace: text(r, 'td.namespace'), reason: text(r, 'td.reason')})),
		history: {leased: !!one(document, 'svg#history-chart polyline.leased'), used: !!one(document, 'svg#history-chart polyline.used')},
		dangling: all(document, '#console a[href^="#"]').map(a => a.getAttribute('href')).filter(h => !document.getElementById(h.slice(1))),
	});
})()`, "${loginErrorShown}", loginErrorShown)

// loginErrorShown is true when #login-error is shown with words in it: the
// element may stay in the page, empty, when there is no error.
const loginErrorShown = `(document.querySelector('#login-error')?.checkVisibility() === true && document.querySelector('#login-error').textContent.trim() !== '')`

func readConsole(t *testing.T, tab context.Context) consoleDOM {
	t.Helper()
	var d consoleDOM
	pageJSON(t, tab, readConsoleJS, &d)
	return d
}

// signIn signs in with token through the login form and waits for the
// first view rendered.
func signIn(t *testing.T, tab context.Context, token string) {
	t.Helper()
	do(t, tab, chromedp.SetValue(chromedp.ID("token"), token), chromedp.Click(chromedp.ID("signin")))
	waitPage(t, tab, 5*time.Second, "body[data-at]", `!!document.body.getAttribute('data-at')`)
}

// waitRendered waits until the page shows a view taken at at or later.
func waitRendered(t *testing.T, tab context.Context, at time.Time) {
	t.Helper()
	waitPage(t, tab, 5*time.Second, "a view of "+at.Format(time.RFC3339Nano),
		fmt.Sprintf(`new Date(document.body.getAttribute('data-at') || 0) >= new Date(%q)`, at.Format(time.RFC3339Nano)))
}

// loadMeasure is a signed-in tab left open, and what its load measured.
type loadMeasure struct {
	tab        context.Context
	mu         sync.Mutex
	polls      int
	heapBefore float64
}

// firstRenderJS, run before the page's own scripts, notes when body's
// data-at is first set, in ms since the navigation started.
const firstRenderJS = `new MutationObserver((_, o) => {
	if (document.body && document.body.hasAttribute('data-at')) { window.__firstRender = performance.now(); o.disconnect(); }
}).observe(document, {subtree: true, attributes: true, attributeFilter: ['data-at']});`

// measureLoad opens the console in a new browser context with the token
// in sessionStorage, as a reload after sign-in finds it, and loads it
// again without the cache: it logs the bytes that load fetched, up to and
// with its first /v1/console, and the time to its first render; then it
// forces a GC and notes the heap, for check to compare once the tab has
// polled a while.
func measureLoad(t *testing.T, chrome context.Context, url, token string) *loadMeasure {
	t.Helper()
	m := &loadMeasure{tab: newTab(t, chrome)}
	do(t, m.tab, chromedp.Navigate(url+"/console/"))
	pageJSON(t, m.tab, fmt.Sprintf(`sessionStorage.setItem('gpupool-token', %q), '{}'`, token), &struct{}{})
	call(t, m.tab, network.SetCacheDisabled, network.SetCacheDisabledParams{CacheDisabled: true})
	call(t, m.tab, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: firstRenderJS})

	// The load starts at the new document's request: the page already open
	// is not measured, whatever it fetches meanwhile.
	var measuring bool
	urls := map[network.RequestID]string{}
	var bytes float64
	var fetched []string
	loaded := make(chan struct{})
	if err := chromedp.Listen(m.tab, func(ev any) {
		m.mu.Lock()
		defer m.mu.Unlock()
		switch ev := ev.(type) {
		case *network.EventRequestWillBeSent:
			if ev.Type == network.ResourceTypeDocument {
				measuring = true
			}
			if !measuring {
				return
			}
			urls[ev.RequestID] = ev.Request.URL
			if strings.HasSuffix(ev.Request.URL, "/v1/console") {
				m.polls++
			}
		case *network.EventLoadingFinished:
			u, ok := urls[ev.RequestID]
			if !ok || loaded == nil {
				return // not the load's, or the load is measured
			}
			bytes += ev.EncodedDataLength
			fetched = append(fetched, fmt.Sprintf("%s %.1f KB", strings.TrimPrefix(u, url), ev.EncodedDataLength/1024))
			if strings.HasSuffix(u, "/v1/console") {
				close(loaded)
				loaded = nil
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	wait := loaded
	m.mu.Unlock()
	do(t, m.tab, chromedp.Navigate(url+"/console/"))
	select {
	case <-wait:
	case <-time.After(10 * time.Second):
		t.Fatal("loaded with a token in sessionStorage, the console did not fetch /v1/console")
	}
	waitPage(t, m.tab, 5*time.Second, "body[data-at]", `!!document.body.getAttribute('data-at')`)
	var first float64
	pageJSON(t, m.tab, `JSON.stringify(window.__firstRender || 0)`, &first)
	m.mu.Lock()
	t.Logf("page weight: %.1f KB in %d requests (%s); first render %.0f ms after the navigation started",
		bytes/1024, len(fetched), strings.Join(fetched, ", "), first)
	if bytes > 300*1024 {
		t.Errorf("the console weighs %.1f KB, over 300 KB", bytes/1024)
	}
	m.polls = 0
	m.mu.Unlock()
	m.heapBefore = heapAfterGC(t, m.tab)
	return m
}

// check waits until the tab has polled 30 times since measureLoad, and
// fails if its heap grew by more than 2 MB: a console left open on a
// wall must not grow.
func (m *loadMeasure) check(t *testing.T) {
	const polls = 30
	deadline := time.Now().Add(45 * time.Second)
	for {
		m.mu.Lock()
		n := m.polls
		m.mu.Unlock()
		if n >= polls {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tab left open polled %d times in 45 s, want %d", n, polls)
		}
		time.Sleep(200 * time.Millisecond)
	}
	after := heapAfterGC(t, m.tab)
	t.Logf("JS heap after GC: %.2f MB signed in, %.2f MB after %d polls (%+.0f KB)",
		m.heapBefore/(1<<20), after/(1<<20), polls, (after-m.heapBefore)/1024)
	if after-m.heapBefore > 2<<20 {
		t.Errorf("the JS heap grew by %.2f MB over %d polls, more than 2 MB", (after-m.heapBefore)/(1<<20), polls)
	}
}

// heapAfterGC is the tab's used JS heap after a full collection.
func heapAfterGC(t *testing.T, tab context.Context) float64 {
	t.Helper()
	for range 2 { // a second pass frees what the first's finalizers let go
		call(t, tab, heapprofiler.CollectGarbage, cdp.Empty{})
	}
	return call(t, tab, runtime.GetHeapUsage, cdp.Empty{}).UsedSize
}

// findChromium is the browser's path, or skips the test.
func findChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	t.Skip("no chromium, chromium-browser or google-chrome on PATH: `make deps` installs Debian's chromium")
	return ""
}

// startBrowser starts headless Chromium in a 1280x800 window, until the
// test ends, and returns its first tab.
func startBrowser(t *testing.T, path string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.Flag("headless", true),
		chromedp.WindowSize(1280, 800))
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium's sandbox refuses to run as root
	}
	allocator, cancelAllocator := chromedp.NewExecAllocator(context.Background(), opts...)
	tab, cancel := chromedp.NewContext(allocator)
	t.Cleanup(func() { cancel(); cancelAllocator() })
	// The first action starts the browser, under no timeout: one would
	// stop the browser with it.
	if err := chromedp.Do(tab); err != nil {
		t.Fatalf("starting %s: %v", path, err)
	}
	do(t, tab, chromedp.EmulateViewport(1280, 800))
	return tab
}

// newTab opens a tab in a new browser context of chrome: its own storage,
// cache and renderer.
func newTab(t *testing.T, chrome context.Context) context.Context {
	t.Helper()
	tab, cancel := chromedp.NewContext(chrome, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	if err := chromedp.Do(tab); err != nil {
		t.Fatal(err)
	}
	do(t, tab, chromedp.EmulateViewport(1280, 800))
	return tab
}

// pageTimeout bounds each step in the page: a page or a browser that hangs
// fails the test instead of holding it until go test's timeout.
const pageTimeout = 20 * time.Second

func do(t *testing.T, tab context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, pageTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatal(err)
	}
}

func run[T any](tab context.Context, a chromedp.Action[T]) (T, error) {
	ctx, cancel := context.WithTimeout(tab, pageTimeout)
	defer cancel()
	return chromedp.Run(ctx, a)
}

func call[P, R any](t *testing.T, tab context.Context, cmd cdp.Command[P, R], params P) R {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, pageTimeout)
	defer cancel()
	r, err := chromedp.Call(ctx, cmd, params)
	if err != nil {
		t.Fatalf("%s: %v", cmd.Method, err)
	}
	return r
}

// pageJSON evaluates expression, which returns JSON text, into out.
func pageJSON(t *testing.T, tab context.Context, expression string, out any) {
	t.Helper()
	s, err := run(tab, chromedp.Evaluate[string](expression))
	if err == nil {
		err = json.Unmarshal([]byte(s), out)
	}
	if err != nil {
		t.Fatalf("evaluating in the page: %v", err)
	}
}

// waitPage waits until condition, a JavaScript expression, is true.
func waitPage(t *testing.T, tab context.Context, limit time.Duration, what, condition string) {
	t.Helper()
	for deadline := time.Now().Add(limit); ; time.Sleep(50 * time.Millisecond) {
		ok, err := run(tab, chromedp.Evaluate[bool](condition))
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			d := readConsole(t, tab)
			t.Fatalf("waited %v for %s (last error %v); the page: login %v, error %v, data area %v, viewer %q, data-at %q, %d data rows",
				limit, what, err, d.Login, d.LoginError, d.Console, d.Viewer, d.At, d.rows())
		}
	}
}

// consoleArtifacts is where the screenshots go: $GPUPOOL_ARTIFACTS, else
// bin/artifacts/console at the repository's root.
func consoleArtifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("GPUPOOL_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join("..", "..", "bin", "artifacts", "console")
	}
	dir, err := filepath.Abs(dir)
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// screenshot saves the whole page, beyond the window too.
func screenshot(t *testing.T, tab context.Context, dir, name string) {
	t.Helper()
	shot, err := run(tab, chromedp.FullScreenshot(100))
	if err != nil {
		t.Errorf("screenshot %s: %v", name, err)
		return
	}
	save(t, dir, name, shot)
}

func save(t *testing.T, dir, name string, png []byte) {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Error(err)
		return
	}
	t.Logf("screenshot %s", path)
}

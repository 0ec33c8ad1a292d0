package allocator

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpupool/gpupool/inventory"
)

// TestScenarios replays the scenario files in testdata/: each command
// changes or prints the pool, and the invariants are checked after each.
// Rewrite the expected output with `go test ./allocator -rewrite` and read
// the diff before committing it.
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/scenarios", func(t *testing.T, path string) {
		s := newScenario(t, "best-fit")
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			out := s.run(t, d)
			if err := s.pool.CheckInvariants(); err != nil {
				t.Fatalf("%s: after %q: invariant broken: %v", d.Pos, d.Cmd, err)
			}
			return out
		})
	})
}

type scenario struct {
	pool *Pool
	now  time.Time
}

func newScenario(t *testing.T, policy string) *scenario {
	pol, err := NewPolicy(policy, PolicyOptions{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPool(PoolConfig{Policy: pol, DefaultTTL: time.Minute, MaxTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return &scenario{pool: p, now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (s *scenario) run(t *testing.T, d *datadriven.TestData) string {
	arg := func(key, def string) string {
		for _, a := range d.CmdArgs {
			if a.Key == key {
				return strings.Join(a.Vals, ",")
			}
		}
		return def
	}
	num := func(key string, def int64) int64 {
		var v int64
		if _, err := fmt.Sscan(arg(key, fmt.Sprint(def)), &v); err != nil {
			d.Fatalf(t, "%s: %v", key, err)
		}
		return v
	}
	bytes := func(key string) int64 {
		if v := arg(key, ""); v != "" {
			// Unbounded, so that scenarios can state what the pool refuses.
			q, err := resource.ParseQuantity(v)
			if err != nil {
				d.Fatalf(t, "%s: %v", key, err)
			}
			return q.Value()
		}
		return 0
	}
	dur := func(key string) time.Duration {
		v, err := time.ParseDuration(arg(key, "0s"))
		if err != nil {
			d.Fatalf(t, "%s: %v", key, err)
		}
		return v
	}
	switch d.Cmd {
	case "pool":
		*s = *newScenario(t, arg("policy", "best-fit"))
		return "ok"
	case "server":
		srv := inventory.Server{Name: arg("name", ""), CPUMilli: num("cpu", 0), MemoryBytes: bytes("memory")}
		unhealthy := map[string]bool{}
		for _, u := range strings.Split(arg("unhealthy", ""), ",") {
			unhealthy[u] = true
		}
		for i := range int(num("gpus", 0)) {
			srv.GPUs = append(srv.GPUs, inventory.GPU{
				Index: i, UUID: fmt.Sprintf("GPU-%s-%d", srv.Name, i), Model: arg("model", "A100"),
				MemoryBytes: bytes("gpu-memory"), Healthy: !unhealthy[fmt.Sprint(i)],
			})
		}
		if top := scenarioTopology(t, d, len(srv.GPUs), arg, num); top != nil {
			srv.SetTopology(top)
		}
		return result(s.pool.RegisterServer(srv))
	case "schedulable":
		_, err := s.pool.SetSchedulable(arg("name", ""), arg("ok", "true") == "true")
		return result(err)
	case "quota":
		if arg("remove", "false") == "true" {
			return result(s.pool.RemoveQuota(arg("ns", "")))
		}
		return result(s.pool.SetQuota(arg("ns", ""), SharePercent(float64(num("percent", 0)))))
	case "acquire":
		r := Request{
			Namespace: arg("ns", "default"), GPUs: int(num("amount", 1)), Percent: int(num("percent", 0)),
			GPUMemoryBytes: bytes("gpu-memory"), CPUMilli: num("cpu", 0), MemoryBytes: bytes("memory"),
			IdempotencyKey: arg("key", ""), TTL: dur("ttl"), Owner: Owner{Pod: arg("pod", "")},
			UntilReleased: arg("until-released", "false") == "true",
		}
		if m := arg("models", ""); m != "" {
			r.Models = strings.Split(m, ",")
		}
		if v := arg("servers", ""); v != "" {
			r.Servers = strings.Split(v, ",")
		}
		if v := arg("topology", ""); v != "" {
			var err error
			if r.Topology, err = inventory.ParseLink("topology", v); err != nil {
				d.Fatalf(t, "%v", err)
			}
		}
		l, err := s.pool.Acquire(s.now, r)
		if err != nil {
			return "error: " + err.Error()
		}
		return formatLease(&l)
	case "renew":
		l, err := s.pool.Renew(s.now, arg("id", ""), dur("ttl"))
		if err != nil {
			return "error: " + err.Error()
		}
		return l.ID + " " + expiryOf(&l)
	case "release":
		l, err := s.pool.Release(s.now, arg("id", ""))
		if err != nil {
			return "error: " + err.Error()
		}
		return "released " + l.ID
	case "clock":
		// Time passes with no call to Expire: operations must still see
		// leases past their expiry as gone.
		s.now = s.now.Add(dur("by"))
		return "ok"
	case "advance":
		s.now = s.now.Add(dur("by"))
		var ids []string
		for _, l := range s.pool.Expire(s.now) {
			ids = append(ids, l.ID)
		}
		if len(ids) == 0 {
			return "nothing expired"
		}
		return "expired " + strings.Join(ids, " ")
	case "state":
		return s.state()
	}
	d.Fatalf(t, "unknown command %q", d.Cmd)
	return ""
}

// topology builds a server's links from the server command's arguments:
// topology=nvswitch, or topology=pcie with per-switch and
// switches-per-socket, then nvlink=0-1,2-3 to bridge pairs by NVLink; nil
// for a server without links.
func scenarioTopology(t *testing.T, d *datadriven.TestData, gpus int, arg func(key, def string) string, num func(key string, def int64) int64) inventory.Topology {
	var top inventory.Topology
	switch kind := arg("topology", ""); kind {
	case "":
		return nil
	case "nvswitch":
		top = inventory.NVSwitchTopology(gpus)
	case "pcie":
		top = inventory.PCIeTopology(gpus, int(num("per-switch", 2)), int(num("switches-per-socket", 2)))
	default:
		d.Fatalf(t, "unknown topology %q", kind)
	}
	for _, pair := range strings.Split(arg("nvlink", ""), ",") {
		var i, j int
		if pair == "" {
			continue
		}
		if _, err := fmt.Sscanf(pair, "%d-%d", &i, &j); err != nil {
			d.Fatalf(t, "nvlink %q: %v", pair, err)
		}
		top[i][j], top[j][i] = inventory.LinkNVLink, inventory.LinkNVLink
	}
	return top
}

// expiryOf says when a lease expires, as time since the scenario's start.
func expiryOf(l *Lease) string {
	if l.UntilReleased() {
		return "until released"
	}
	return "expires +" + l.ExpiresAt.Sub(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)).String()
}

func result(err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return "ok"
}

func formatLease(l *Lease) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s on %s:", l.ID, l.Namespace, l.Server)
	for _, g := range l.GPUs {
		fmt.Fprintf(&b, " gpu%d=%s", g.Index, g.Share)
		if g.MemoryBytes > 0 {
			fmt.Fprintf(&b, "(%s)", formatBytes(g.MemoryBytes))
		}
	}
	if l.CPUMilli > 0 || l.MemoryBytes > 0 {
		fmt.Fprintf(&b, " cpu=%dm memory=%s", l.CPUMilli, formatBytes(l.MemoryBytes))
	}
	return b.String()
}

// state prints each server's leased share per GPU, the leases and quotas.
func (s *scenario) state() string {
	var b strings.Builder
	for _, st := range s.pool.ServerStates() {
		n := &st.Node
		fmt.Fprintf(&b, "%s", st.Server.Name)
		if !n.Schedulable {
			b.WriteString(" (unschedulable)")
		}
		b.WriteString(":")
		for gi := range n.GPUs {
			g := &n.GPUs[gi]
			fmt.Fprintf(&b, " %s", WholeGPU-g.Free)
			if !g.Healthy {
				b.WriteString("(unhealthy)")
			}
		}
		if n.CPUCap > 0 {
			fmt.Fprintf(&b, " cpu-free=%dm", n.CPUFree)
		}
		b.WriteString("\n")
	}
	for _, l := range s.pool.Leases(s.now) {
		fmt.Fprintf(&b, "%s %s\n", formatLease(&l), expiryOf(&l))
	}
	for _, q := range s.pool.Quotas(s.now) {
		hard := "unlimited"
		if q.Limited {
			hard = q.Hard.String()
		}
		fmt.Fprintf(&b, "quota %s: used %s of %s\n", q.Namespace, q.Used, hard)
	}
	return strings.TrimRight(b.String(), "\n")
}

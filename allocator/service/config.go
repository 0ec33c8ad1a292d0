package service

import (
	"crypto/subtle"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"

	"sigs.k8s.io/yaml"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
)

// QuotaResource is the ResourceQuota key whose value is a namespace's GPU
// quota in percent of one GPU (100 = one whole GPU).
const QuotaResource = "requests.bitfusion.io/gpu"

// FileConfig is the allocator's config file: namespace quotas in the
// shape of a ResourceQuota's hard limits, and bearer tokens.
//
//	admin:   {tokens: [...]}          # every namespace, every operation
//	readers: {tokens: [...]}          # every namespace, reading only (the adapter)
//	servers:
//	  tokens: [...]                   # GPU-server daemons, as any server
//	  perServer: {gpu-0: [...]}       # as gpu-0 only
//	namespaces:
//	  team-a:
//	    hard: {requests.bitfusion.io/gpu: 200}
//	    tokens: [...]                 # leases in team-a only
//	    idle: {useBelow: 0.1, window: 30m, grace: 15m, action: reclaim}
type FileConfig struct {
	Admin TokenSet `json:"admin"`
	// Readers see what an admin sees and change nothing: every request but
	// a GET is refused with 403 (the metrics adapter reads the pool and
	// its leases, and needs no more).
	Readers    TokenSet                   `json:"readers"`
	Servers    ServersConfig              `json:"servers"`
	Namespaces map[string]NamespaceConfig `json:"namespaces"`
}

// ServersConfig holds the GPU-server daemons' tokens. A token of Tokens
// may speak for any server: one Secret shared by a DaemonSet is that, and
// it trusts every daemon holding it as every server (as kubelets were
// trusted before NodeRestriction). A token of PerServer speaks for its
// server only: it registers, heart-beats and reads the leases of that
// server and no other.
type ServersConfig struct {
	Tokens    []string            `json:"tokens"`
	PerServer map[string][]string `json:"perServer"`
}

// TokenSet lists bearer tokens.
type TokenSet struct {
	Tokens []string `json:"tokens"`
}

// NamespaceConfig is one namespace's quota, tokens and idle policy.
type NamespaceConfig struct {
	Hard   map[string]resource.Quantity `json:"hard"`
	Tokens []string                     `json:"tokens"`
	// Idle is the namespace's idle policy; DefaultIdlePolicy when nil.
	Idle *IdlePolicy `json:"idle"`
}

// LoadConfig reads and checks a config file.
func LoadConfig(path string) (*FileConfig, error) {
	data, err := os.ReadFile(path) //nolint:gosec // the operator names the config file
	if err != nil {
		return nil, err
	}
	var c FileConfig
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &c, nil
}

func (c *FileConfig) validate() error {
	seen := map[string]string{}
	check := func(where string, tokens []string) error {
		for i, t := range tokens {
			field := where + ".tokens[" + strconv.Itoa(i) + "]"
			if len(t) < 16 {
				return &allocator.FieldError{Field: field, Value: strconv.Itoa(len(t)) + " characters", Limit: "is shorter than 16 characters"}
			}
			if other, dup := seen[t]; dup {
				return &allocator.FieldError{Field: field, Value: "(redacted)", Limit: "is also a token of " + other}
			}
			seen[t] = where
		}
		return nil
	}
	if err := check("admin", c.Admin.Tokens); err != nil {
		return err
	}
	if err := check("readers", c.Readers.Tokens); err != nil {
		return err
	}
	if err := check("servers", c.Servers.Tokens); err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(c.Servers.PerServer)) {
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return &allocator.FieldError{Field: "servers.perServer", Value: name, Limit: "is not a node name: " + errs[0]}
		}
		if err := check("servers.perServer."+name, c.Servers.PerServer[name]); err != nil {
			return err
		}
	}
	for _, ns := range slices.Sorted(maps.Keys(c.Namespaces)) {
		nc := c.Namespaces[ns]
		if err := check("namespaces."+ns, nc.Tokens); err != nil {
			return err
		}
		if nc.Idle != nil {
			if err := nc.Idle.validate("namespaces." + ns + ".idle"); err != nil {
				return err
			}
		}
		for k, q := range nc.Hard {
			field := "namespaces." + ns + ".hard." + k
			if k != QuotaResource {
				return &allocator.FieldError{Field: field, Value: q.String(), Limit: "is not a known resource (want " + QuotaResource + ")"}
			}
			if v, ok := q.AsInt64(); !ok || v < 0 || v > maxQuotaPercent {
				return &allocator.FieldError{Field: field, Value: q.String(), Limit: fmt.Sprintf("must be a whole number of percent of one GPU, 0..%d (a million GPUs)", maxQuotaPercent)}
			}
		}
	}
	return nil
}

// maxQuotaPercent bounds a namespace's quota far above any pool, so that
// its share stays exact.
const maxQuotaPercent = 100 * 1_000_000

// quotaShare checks a quota set through the API against the bounds of the
// config file's, in percent of one GPU to a tenth (a milli-GPU), and
// returns it as a share.
func quotaShare(in api.QuotaRequest) (allocator.Share, error) {
	const field = "hardPercent"
	p := in.HardPercent
	switch {
	case p == nil:
		return 0, &allocator.FieldError{Field: field, Value: "", Limit: "must be set, in percent of one GPU (150 is 1.5 GPUs)"}
	case *p < 0 || *p > maxQuotaPercent:
		return 0, &allocator.FieldError{Field: field, Value: strconv.FormatFloat(*p, 'f', -1, 64),
			Limit: fmt.Sprintf("out of range 0..%d (percent of one GPU, a million GPUs)", maxQuotaPercent)}
	case allocator.SharePercent(*p).Percent() != *p:
		return 0, &allocator.FieldError{Field: field, Value: strconv.FormatFloat(*p, 'f', -1, 64),
			Limit: "is finer than a tenth of a percent (a thousandth of a GPU)"}
	}
	return allocator.SharePercent(*p), nil
}

// IdlePolicies returns the idle policy of each namespace that has one;
// none without a config.
func (c *FileConfig) IdlePolicies() map[string]IdlePolicy {
	out := map[string]IdlePolicy{}
	if c == nil {
		return out
	}
	for ns, nc := range c.Namespaces {
		if nc.Idle != nil {
			out[ns] = *nc.Idle
		}
	}
	return out
}

// Quotas returns each namespace's GPU quota; none without a config.
func (c *FileConfig) Quotas() map[string]allocator.Share {
	out := map[string]allocator.Share{}
	if c == nil {
		return out
	}
	for ns, nc := range c.Namespaces {
		if q, ok := nc.Hard[QuotaResource]; ok {
			percent, _ := q.AsInt64()
			out[ns] = allocator.SharePercent(float64(percent))
		}
	}
	return out
}

// Principal is who a request acts as.
type Principal struct {
	Admin bool
	// Reader sees every namespace as Admin does, and may change nothing.
	Reader bool
	// Server is set for GPU-server daemons; ServerName binds one to a
	// single server ("" speaks for any).
	Server     bool
	ServerName string
	Namespace  string // for namespace tokens
}

// seesAll reports whether p reads every namespace: an admin or a reader.
func (p Principal) seesAll() bool { return p.Admin || p.Reader }

// mayUse reports whether p may act on leases of namespace ns.
func (p Principal) mayUse(ns string) bool { return p.Admin || p.Namespace != "" && p.Namespace == ns }

// mayServe reports whether p may speak for the GPU server named server:
// register it, heart-beat and read the leases placed on it.
func (p Principal) mayServe(server string) bool {
	return p.Admin || p.Server && (p.ServerName == "" || p.ServerName == server)
}

// mayRead reports whether p may see a lease: its namespace's tokens, and
// the daemon of the server it is placed on.
func (p Principal) mayRead(l *allocator.Lease) bool {
	return p.Reader || p.mayUse(l.Namespace) || p.mayServe(l.Server)
}

// Authenticator maps bearer tokens to principals.
type Authenticator struct {
	tokens []tokenEntry // constant-time compared, so a scan
}

type tokenEntry struct {
	token []byte
	who   Principal
}

// NewAuthenticator builds the token table of a config.
func NewAuthenticator(c *FileConfig) *Authenticator {
	a := &Authenticator{}
	add := func(tokens []string, who Principal) {
		for _, t := range tokens {
			a.tokens = append(a.tokens, tokenEntry{[]byte(t), who})
		}
	}
	add(c.Admin.Tokens, Principal{Admin: true})
	add(c.Readers.Tokens, Principal{Reader: true})
	add(c.Servers.Tokens, Principal{Server: true})
	for name, tokens := range c.Servers.PerServer {
		add(tokens, Principal{Server: true, ServerName: name})
	}
	for ns, nc := range c.Namespaces {
		add(nc.Tokens, Principal{Namespace: ns})
	}
	return a
}

// Lookup returns the principal of a token.
func (a *Authenticator) Lookup(token string) (Principal, bool) {
	var found Principal
	ok := false
	for _, e := range a.tokens {
		if subtle.ConstantTimeCompare(e.token, []byte(token)) == 1 {
			found, ok = e.who, true
		}
	}
	return found, ok
}

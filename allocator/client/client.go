// Package client is the typed Go client of the allocator's HTTP API, used
// by the GPU-server daemon, the CLI, the adapter and the tests.
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
)

// Client talks to one allocator, or to the replicas of one, trying the next
// endpoint when one is down or not the leader.
type Client struct {
	endpoints []string
	token     string
	http      *http.Client
	// Retries bounds attempts per call across endpoints when the allocator
	// is unreachable or unavailable (a failover in progress).
	Retries int
	// Backoff is the pause between rounds over all endpoints.
	Backoff time.Duration
	// Timeout bounds a call whose context has no deadline (an acquire
	// that waits gets its wait on top).
	Timeout time.Duration
}

// New returns a client for the allocator at the given base URLs
// (comma-separated replicas are split), authenticating with token.
func New(endpoints []string, token string) (*Client, error) {
	var eps []string
	for _, e := range endpoints {
		for _, part := range strings.Split(e, ",") {
			part = strings.TrimRight(strings.TrimSpace(part), "/")
			if part == "" {
				continue
			}
			if u, err := url.Parse(part); err != nil || u.Scheme == "" || u.Host == "" {
				return nil, fmt.Errorf("allocator address %q is not a URL such as http://127.0.0.1:8470", part)
			}
			eps = append(eps, part)
		}
	}
	if len(eps) == 0 {
		return nil, errors.New("no allocator address given")
	}
	return &Client{endpoints: eps, token: token, http: &http.Client{Transport: keepAlive()}, Retries: 20, Backoff: 250 * time.Millisecond, Timeout: 30 * time.Second}, nil
}

// TrustCAFile has the client verify an https:// allocator against the CA
// certificates (PEM) in path, rather than the system's roots, as
// deploy/certs.sh and cert-manager issue the allocator's. "" keeps the
// system's roots.
func (c *Client) TrustCAFile(path string) error {
	if path == "" {
		return nil
	}
	pem, err := os.ReadFile(path) //nolint:gosec // the operator names the CA file
	if err != nil {
		return fmt.Errorf("the allocator's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("the allocator's CA: %s holds no PEM certificate", path)
	}
	c.SetTLS(&tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool})
	return nil
}

// SetTLS has the client speak to an https:// allocator as cfg says (its
// roots, the name to verify when the address is an IP).
func (c *Client) SetTLS(cfg *tls.Config) {
	c.http.Transport.(*http.Transport).TLSClientConfig = cfg
}

// idleConnections is how many connections to each endpoint a client keeps
// open between calls: as many as a scheduler's concurrent binds and its
// filter make at once, where http.DefaultTransport keeps 2 and closes the
// rest after every burst, to open them again at the next.
const idleConnections = 64

// keepAlive is http.DefaultTransport keeping idleConnections per endpoint.
func keepAlive() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost, t.MaxIdleConns = idleConnections, 0
	return t
}

// RegisterServer registers or updates a GPU server.
func (c *Client) RegisterServer(ctx context.Context, s api.Server) error {
	return c.do(ctx, http.MethodPut, "/v1/servers/"+url.PathEscape(s.Name), s, nil)
}

// Heartbeat reports a server alive, with its GPUs' health.
func (c *Client) Heartbeat(ctx context.Context, server string, hb api.Heartbeat) error {
	return c.do(ctx, http.MethodPost, "/v1/servers/"+url.PathEscape(server)+"/heartbeat", hb, nil)
}

// Acquire asks for a lease. Without an idempotency key it makes one, so
// that retries through a failover never allocate twice.
func (c *Client) Acquire(ctx context.Context, r api.AcquireRequest) (api.Lease, error) {
	if r.IdempotencyKey == "" {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return api.Lease{}, err
		}
		r.IdempotencyKey = hex.EncodeToString(b)
	}
	if wait, err := api.ParseDuration("wait", r.Wait, api.MaxWait); err == nil && wait > 0 {
		if _, has := ctx.Deadline(); !has {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, wait+c.Timeout)
			defer cancel()
		}
	}
	var l api.Lease
	err := c.do(ctx, http.MethodPost, "/v1/leases", r, &l)
	return l, err
}

// Renew extends a lease by ttl (its own TTL when 0).
func (c *Client) Renew(ctx context.Context, id string, ttl time.Duration) (api.Lease, error) {
	var in api.RenewRequest
	if ttl > 0 {
		in.TTL = ttl.String()
	}
	var l api.Lease
	err := c.do(ctx, http.MethodPost, "/v1/leases/"+url.PathEscape(id)+"/renew", in, &l)
	return l, err
}

// Release ends a lease. Releasing one already gone is not an error, so a
// retried release is safe.
func (c *Client) Release(ctx context.Context, id string) error {
	err := c.do(ctx, http.MethodDelete, "/v1/leases/"+url.PathEscape(id), nil, nil)
	if IsReason(err, api.ReasonNotFound) {
		return nil
	}
	return err
}

// Lease returns one lease.
func (c *Client) Lease(ctx context.Context, id string) (api.Lease, error) {
	var l api.Lease
	err := c.do(ctx, http.MethodGet, "/v1/leases/"+url.PathEscape(id), nil, &l)
	return l, err
}

// LeaseFilter selects leases; empty fields match all.
type LeaseFilter struct {
	Namespace, Server string
	OwnerUID          string // the owner's UID: a pod's leases
	Selector          string // a label selector on the owner's labels: app=tf-training
	Idle              bool   // only the leases measured idle (api.Lease.Idle)
}

// Leases lists live leases.
func (c *Client) Leases(ctx context.Context, f LeaseFilter) ([]api.Lease, error) {
	q := url.Values{}
	for k, v := range map[string]string{"namespace": f.Namespace, "server": f.Server, "ownerUID": f.OwnerUID, "selector": f.Selector} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if f.Idle {
		q.Set("idle", "true")
	}
	path := "/v1/leases"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out api.LeaseList
	err := c.do(ctx, http.MethodGet, path, nil, &out)
	return out.Leases, err
}

// Pool returns the pool's servers and GPUs.
func (c *Client) Pool(ctx context.Context) (api.PoolStatus, error) {
	var out api.PoolStatus
	err := c.do(ctx, http.MethodGet, "/v1/pool", nil, &out)
	return out, err
}

// Console returns the pool as the console page shows it to this client's
// token.
//
// A read past the token's pace is answered 429 a second later
// (api.ReasonTooManyRequests); Console then reads again, until ctx ends.
func (c *Client) Console(ctx context.Context) (api.Console, error) {
	for {
		var out api.Console
		err := c.do(ctx, http.MethodGet, "/v1/console", nil, &out)
		if !IsReason(err, api.ReasonTooManyRequests) || ctx.Err() != nil {
			return out, err
		}
	}
}

// Server returns one server of the pool, its GPUs and their health, as
// Pool shows it.
func (c *Client) Server(ctx context.Context, name string) (api.ServerStatus, error) {
	var out api.ServerStatus
	err := c.do(ctx, http.MethodGet, "/v1/servers/"+url.PathEscape(name), nil, &out)
	return out, err
}

// Quotas returns quota and use per namespace.
func (c *Client) Quotas(ctx context.Context) ([]api.QuotaStatus, error) {
	var out api.QuotaList
	err := c.do(ctx, http.MethodGet, "/v1/quotas", nil, &out)
	return out.Quotas, err
}

// SetQuota sets a namespace's hard GPU quota (an admin token's right).
// The allocator keeps it across restarts, over its config file's.
func (c *Client) SetQuota(ctx context.Context, namespace string, hard allocator.Share) error {
	percent := hard.Percent()
	return c.do(ctx, http.MethodPut, "/v1/quotas/"+url.PathEscape(namespace), api.QuotaRequest{HardPercent: &percent}, nil)
}

// DeleteQuota removes a namespace's quota, leaving it unlimited (an admin
// token's right).
func (c *Client) DeleteQuota(ctx context.Context, namespace string) error {
	return c.do(ctx, http.MethodDelete, "/v1/quotas/"+url.PathEscape(namespace), nil, nil)
}

// UnreachableError says that no endpoint of the allocator answered: it is
// not running there, or the network is in the way.
type UnreachableError struct {
	// Endpoints are the allocator's addresses that were tried.
	Endpoints []string
	// Err is the last attempt's failure, such as a refused connection.
	Err error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("cannot reach the allocator at %s: %v", strings.Join(e.Endpoints, ","), e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// IsReason reports whether err is an API error with that reason.
func IsReason(err error, reason string) bool {
	var e *api.Error
	return errors.As(err, &e) && e.Reason == reason
}

// do sends a request, trying the endpoints in turn while they are
// unreachable or answer 503, and decodes the answer into out. When none
// answered, the error is an *UnreachableError naming them all.
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	if _, has := ctx.Deadline(); !has && c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return err
		}
	}
	var last error
	for attempt := 0; attempt < max(c.Retries, 1); attempt++ {
		if attempt > 0 && attempt%len(c.endpoints) == 0 {
			select {
			case <-time.After(c.Backoff):
			case <-ctx.Done():
				return fmt.Errorf("%w (last: %w)", ctx.Err(), c.unreachable(last))
			}
		}
		ep := c.endpoints[attempt%len(c.endpoints)]
		retry, err := c.once(ctx, method, ep, path, body, out)
		if err == nil || !retry {
			return err
		}
		last = err
	}
	return c.unreachable(last)
}

// unreachable widens one endpoint's *UnreachableError, after every
// endpoint was tried, to name them all; other errors pass unchanged.
func (c *Client) unreachable(err error) error {
	var u *UnreachableError
	if errors.As(err, &u) {
		return &UnreachableError{Endpoints: c.endpoints, Err: u.Err}
	}
	return err
}

func (c *Client) once(ctx context.Context, method, endpoint, path string, body []byte, out any) (retry bool, err error) {
	u := endpoint + path
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		// The cause without the *url.Error's method and URL: the
		// message names the endpoint.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return ctx.Err() == nil, &UnreachableError{Endpoints: []string{endpoint}, Err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		// The allocator was reached: a cut answer is worth a retry, not
		// advice to start one.
		return true, fmt.Errorf("reading the allocator's answer to %s %s from %s: %w", method, path, endpoint, err)
	}
	if resp.StatusCode >= 300 {
		e := &api.Error{}
		if json.Unmarshal(data, e) != nil || e.Reason == "" {
			e = &api.Error{Reason: api.ReasonInternal, Message: fmt.Sprintf("allocator answered %s: %s", resp.Status, bytes.TrimSpace(data))}
		}
		return resp.StatusCode == http.StatusServiceUnavailable, e
	}
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			return false, fmt.Errorf("allocator %s: decoding answer: %w", u, err)
		}
	}
	return false, nil
}

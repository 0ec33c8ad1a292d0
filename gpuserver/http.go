package gpuserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpupool/gpupool/allocator/api"
)

// ProcessReport is what `gpupool run` tells the daemon: the command it
// started runs under this lease.
type ProcessReport struct {
	PID   int    `json:"pid"`
	Lease string `json:"lease"`
}

// ReportProcess tells the daemon at url that a process runs under a lease.
func ReportProcess(ctx context.Context, url string, p ProcessReport) error {
	body, err := json.Marshal(p)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(url, "/")+"/v1/processes", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("daemon answered %s", resp.Status)
	}
	return nil
}

// Handler serves /metrics, /healthz, GET /v1/usage and POST /v1/processes.
func Handler(d *Daemon, gatherer prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /v1/usage", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(d.UsageReport())
	})
	mux.HandleFunc("POST /v1/processes", func(w http.ResponseWriter, r *http.Request) {
		// A PID means something only on this host: reports come from
		// `gpupool run` here, over loopback, and from nowhere else.
		if host, _, err := net.SplitHostPort(r.RemoteAddr); err != nil || !net.ParseIP(host).IsLoopback() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			_ = json.NewEncoder(w).Encode(api.Error{Reason: api.ReasonForbidden, Message: "process reports are taken from this host only"})
			return
		}
		var p ProcessReport
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil || p.PID <= 1 || p.Lease == "" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(api.Error{Reason: api.ReasonInvalid, Message: "want {\"pid\": >1, \"lease\": \"lease-...\"}",
				Field: "pid", Limit: "must be a process ID above 1, with the lease it runs under"})
			return
		}
		d.RegisterPID(p.PID, p.Lease)
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

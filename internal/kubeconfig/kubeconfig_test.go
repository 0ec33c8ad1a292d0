package kubeconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoad: a kubeconfig file names its cluster, spoken to in protobuf;
// without one, outside a pod, there is none, and the error says so.
func TestLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://10.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil || cfg.Host != "https://10.0.0.1:6443" || cfg.BearerToken != "t" {
		t.Fatalf("Load(%s): %+v, %v", path, cfg, err)
	}
	if cfg.ContentType != "application/vnd.kubernetes.protobuf" || cfg.AcceptContentTypes != "application/vnd.kubernetes.protobuf,application/json" {
		t.Errorf("Load(%s): content type %q, accepts %q; want protobuf, then JSON", path, cfg.ContentType, cfg.AcceptContentTypes)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := Load(""); err == nil || !strings.Contains(err.Error(), "KUBERNETES_SERVICE_HOST") {
		t.Errorf("outside a pod: %v, want an error naming KUBERNETES_SERVICE_HOST", err)
	}
}

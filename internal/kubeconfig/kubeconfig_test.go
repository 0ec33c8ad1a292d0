package kubeconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

// TestLoad: a kubeconfig file names its cluster, spoken to in protobuf;
// without one, outside a pod, there is none, and the error says so.
func TestLoad(t *testing.T) {
	path := writeKubeconfig(t)
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

// TestClient: the clientset is made from the kubeconfig, tuned, and
// without a cluster the error names --kubeconfig.
func TestClient(t *testing.T) {
	path := writeKubeconfig(t)
	tuned := false
	if c, err := Client(path, "test", func(*rest.Config) { tuned = true }); err != nil || c == nil || !tuned {
		t.Errorf("Client(%s): %v, %v, tuned %v; want a clientset, tuned", path, c, err, tuned)
	}
	if _, err := Client(path+".missing", "test", nil); err == nil || !strings.HasPrefix(err.Error(), "no cluster (--kubeconfig, or run in a pod): ") {
		t.Errorf("no kubeconfig: %v, want an error naming --kubeconfig", err)
	}
}

// writeKubeconfig writes a kubeconfig of the cluster at
// https://10.0.0.1:6443, with the token t, and returns its path.
func writeKubeconfig(t *testing.T) string {
	t.Helper()
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
	return path
}

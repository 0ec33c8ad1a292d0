package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// cniBinDir is where Debian's containernetworking-plugins installs the CNI
// plugins.
const cniBinDir = "/usr/lib/cni"

// containerdPaths are where a node's containerd keeps everything: nothing
// under the machine's /var/lib/containerd or /run/containerd, so that it
// runs beside a containerd the machine may have.
type containerdPaths struct {
	root, state string
	// socket serves containerd's API and the CRI; a unix socket's path
	// must stay under 108 bytes, which is why state is a short directory.
	socket     string
	cniConfDir string
	cniIPAMDir string // host-local's record of the addresses it gave
}

// containerdPlaces is the start of a containerd configuration of the
// version: where it keeps everything, which no version names otherwise.
func containerdPlaces(p containerdPaths, version int) []byte {
	// %q writes a TOML basic string for the paths and refs used here.
	return fmt.Appendf(nil, `version = %d
root = %q
state = %q

[grpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, version, p.root, p.state, p.socket, p.root+"/opt")
}

// containerdConfig is containerd 1.6's configuration for a node whose pod
// sandboxes run sandboxImage.
func containerdConfig(p containerdPaths, sandboxImage string) []byte {
	return fmt.Appendf(containerdPlaces(p, 2), `
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  # Root here may not lower a process's oom_score_adj, and runc fails to
  # start a sandbox at the -998 the CRI gives it. With this, containerd
  # keeps the score at or above its own.
  restrict_oom_score_adj = true
  # The pods' network namespaces are bind-mounted here, not in
  # /var/run/netns.
  netns_mounts_under_state_dir = true

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q

  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      Root = %q
      # cgroupfs, as the kubelet's cgroupDriver.
      SystemdCgroup = false
`, sandboxImage, cniBinDir, p.cniConfDir, p.state+"/runc")
}

// containerd2Config is containerd 2's configuration (version 3) for a
// node whose pod sandboxes run sandboxImage, reading CDI specs from
// cdiDir: what containerdConfig says to 1.6, under 2's plugin names.
func containerd2Config(p containerdPaths, sandboxImage, cdiDir string) []byte {
	return fmt.Appendf(containerdPlaces(p, 3), `
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = %q

[plugins."io.containerd.cri.v1.runtime"]
  enable_cdi = true
  cdi_spec_dirs = [%q]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true

  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%q]
    conf_dir = %q

  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"

    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
      Root = %q
      SystemdCgroup = false
`, sandboxImage, cdiDir, cniBinDir, p.cniConfDir, p.state+"/runc")
}

// podCIDR holds the node's pods' addresses.
const podCIDR = "10.244.0.0/24"

// cniBridgeNetwork is the CNI network the node's pods join: a Linux bridge
// on the host with host-local addresses from podCIDR, reached from the
// host alone (no masquerade, so no iptables rules to clean up). The pods'
// default route is the bridge, so that they reach the host's addresses and
// Services' ClusterIPs, which kube-proxy routes from the host. Hairpin
// mode lets a pod reach itself through a Service's ClusterIP, which
// kube-proxy sends back out of the port it came in by. The bridge stays
// after the node stops, as it would on a real node, and the next node
// uses it again.
func cniBridgeNetwork(ipamDir string) ([]byte, error) {
	return json.MarshalIndent(map[string]any{
		"cniVersion": "1.0.0",
		"name":       "gpupool-e2e",
		"plugins": []map[string]any{{
			"type":        "bridge",
			"bridge":      "gpupool-e2e0",
			"isGateway":   true,
			"hairpinMode": true,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  [][]map[string]string{{{"subnet": podCIDR}}},
				"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
				"dataDir": ipamDir,
			},
		}},
	}, "", "  ")
}

// dialCRI connects to the CRI that containerd serves on socket.
func dialCRI(socket string) (*grpc.ClientConn, runtimeapi.RuntimeServiceClient, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return conn, runtimeapi.NewRuntimeServiceClient(conn), nil
}

// runtimeReady is a check that the CRI says both the runtime and its
// network are ready, as the kubelet needs before it calls its node Ready.
func runtimeReady(runtime runtimeapi.RuntimeServiceClient) func(context.Context) error {
	return func(ctx context.Context) error {
		resp, err := runtime.Status(ctx, &runtimeapi.StatusRequest{})
		if err != nil {
			return err
		}
		// The two the kubelet reads: containerd 2 adds others, such as
		// ContainerdHasNoDeprecationWarnings (false on cgroup v1).
		for _, c := range resp.GetStatus().GetConditions() {
			if (c.Type == runtimeapi.RuntimeReady || c.Type == runtimeapi.NetworkReady) && !c.Status {
				return fmt.Errorf("%s: %s: %s", c.Type, c.Reason, c.Message)
			}
		}
		return nil
	}
}

// removePodSandboxes stops and removes every pod sandbox, as the kubelet
// does when it deletes a pod: the containers are killed, their mounts
// undone, their network torn down and the addresses given back, which
// stopping containerd alone would leave behind (its shims outlive it).
func removePodSandboxes(ctx context.Context, runtime runtimeapi.RuntimeServiceClient) error {
	resp, err := runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("listing the pod sandboxes: %w", err)
	}
	var errs []error
	for _, sandbox := range resp.Items {
		if _, err := runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sandbox.Id}); err != nil {
			errs = append(errs, fmt.Errorf("stopping the sandbox of pod %s/%s: %w", sandbox.Metadata.Namespace, sandbox.Metadata.Name, err))
			continue
		}
		if _, err := runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sandbox.Id}); err != nil {
			errs = append(errs, fmt.Errorf("removing the sandbox of pod %s/%s: %w", sandbox.Metadata.Namespace, sandbox.Metadata.Name, err))
		}
	}
	return errors.Join(errs...)
}

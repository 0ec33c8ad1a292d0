package kube

import (
	"context"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// apiserverKubeletClient is the user the apiserver is to kubelets when it
// reads a pod's log or runs exec.
const apiserverKubeletClient = "kube-apiserver-kubelet-client"

// PauseImage is the image of the node's pod sandboxes, built from
// pause/ and imported by StartNode.
const PauseImage = "e2e.gpupool.local/pause:v1"

// NodeOptions configure StartNode.
type NodeOptions struct {
	// Name is the node's name, and the name of the kubelet's client
	// certificate's user: system:node:<Name>.
	Name string
	// Services runs kube-proxy and CoreDNS beside the kubelet, so that
	// pods and the apiserver reach Services by ClusterIP, and pods by
	// name: a cluster whose components run as pods. The control plane
	// must have Options.PodNetwork, for pods to reach the apiserver.
	Services bool
	// Containerd2Dir, when set, holds containerd 2 and its runc shim
	// (build.sh containerd), which the node runs instead of the machine's
	// containerd 1.6: 2 applies CDI specs, which DRA drivers write, from
	// KubeletNode.CDIDir.
	Containerd2Dir string
}

// KubeletNode is a node run by a real kubelet over containerd: its pods'
// containers run on this machine.
type KubeletNode struct {
	Name string
	// ContainerdSocket is the path of containerd's socket, for ctr
	// --address and CRI clients.
	ContainerdSocket string
	// KubeletDir is the kubelet's root directory: DRA's kubelet plugins
	// register in its plugins_registry.
	KubeletDir string
	// CDIDir is where containerd 2 reads CDI specs
	// (NodeOptions.Containerd2Dir).
	CDIDir string

	cp         *ControlPlane
	dir        string // the kubelet's and containerd's files
	state      string // containerd's state and the kubelet's root (short paths, for sockets), removed by Stop
	containerd *process
	kubelet    *process
	proxy, dns *process // with NodeOptions.Services
	kubeletCmd []string // the kubelet's binary and arguments, to start it again
	healthz    string   // the kubelet's /healthz URL
	runtime    runtimeapi.RuntimeServiceClient
	criConn    *grpc.ClientConn
	lock       *os.File // nodeLock, held until Stop
	stopped    bool
}

// nodeLock is the file whose lock a running KubeletNode holds, so that
// two test processes never run a node at once.
var nodeLock = filepath.Join(os.TempDir(), "gpupool-e2e-node.lock")

// lockNode takes the lock of the file at path, waiting while another
// open file holds it, until ctx ends; closing the file releases it.
func lockNode(ctx context.Context, path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("another process runs a kubelet node (it holds %s): %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// CheckCanRunNode returns why this machine cannot run a KubeletNode, or
// nil: containerd needs root, and the node needs containerd, ctr, runc and
// the CNI plugins that Debian's containerd, runc and
// containernetworking-plugins packages install (make deps).
func CheckCanRunNode() error {
	if os.Geteuid() != 0 {
		return errors.New("a kubelet node needs root, to run containerd and runc")
	}
	for _, bin := range []string{"containerd", "ctr", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("a kubelet node needs %s (make deps installs it): %w", bin, err)
		}
	}
	for _, plugin := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(cniBinDir, plugin)); err != nil {
			return fmt.Errorf("a kubelet node needs the CNI plugin %s (make deps installs containernetworking-plugins): %w", plugin, err)
		}
	}
	_, err := hostIP()
	return err
}

// hostIP is the first IPv4 address of this machine's interfaces but
// loopback's, which a kubelet refuses as its node's. The node's kubelet
// serves there, and the apiserver, on the same machine, reaches it there.
func hostIP() (net.IP, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	for _, addr := range addrs {
		if ipNet, ok := addr.(*net.IPNet); ok {
			if ip := ipNet.IP.To4(); ip != nil && !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
				return ip, nil
			}
		}
	}
	return nil, errors.New("a kubelet node needs an IPv4 address other than loopback's, which a kubelet refuses as its node's")
}

// StartNode starts containerd and a kubelet that registers the node
// o.Name with the control plane, and returns once the node is Ready. Its
// pod sandboxes run PauseImage; other images come from ImportImages, and
// pods name them with imagePullPolicy Never or IfNotPresent, as nothing is
// pulled. The caller must call Stop, before the control plane's, even if
// the test fails. On error, everything started has been stopped.
//
// One node at a time runs on a machine: the kubelet serves device plugins
// at /var/lib/kubelet/device-plugins whatever its root directory, and
// every kubelet of cgroupfs owns /kubepods. StartNode waits, until ctx
// ends, while another process's node runs (nodeLock). The node's logs are
// <Dir>/containerd.log and <Dir>/kubelet.log.
func (c *ControlPlane) StartNode(ctx context.Context, o NodeOptions) (_ *KubeletNode, err error) {
	if o.Name == "" {
		return nil, errors.New("NodeOptions.Name must be set")
	}
	if err := CheckCanRunNode(); err != nil {
		return nil, err
	}
	dir := filepath.Join(c.dir, "node-"+o.Name)
	// t.TempDir's paths grow with the test's name; sockets need short ones.
	state, err := os.MkdirTemp("", "gpupool-node-")
	if err != nil {
		return nil, err
	}
	paths := containerdPaths{
		root:       filepath.Join(dir, "containerd"),
		state:      state,
		socket:     filepath.Join(state, "containerd.sock"),
		cniConfDir: filepath.Join(dir, "cni"),
		cniIPAMDir: filepath.Join(dir, "cni-ipam"),
	}
	// The kubelet's root is in the short directory too: the sockets of
	// the plugins it serves are made under it (plugins_registry/...), and a
	// test's directory left a DRA plugin's over the 108 bytes a socket's
	// path may have in one run of two.
	n := &KubeletNode{Name: o.Name, ContainerdSocket: paths.socket, KubeletDir: filepath.Join(state, "kubelet"), cp: c, dir: dir, state: state}
	defer func() {
		if err != nil {
			err = errors.Join(err, n.Stop())
		}
	}()
	if n.lock, err = lockNode(ctx, nodeLock); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(paths.cniConfDir, 0o755); err != nil {
		return nil, err
	}
	network, err := cniBridgeNetwork(paths.cniIPAMDir)
	if err != nil {
		return nil, err
	}
	f := &files{dir: dir}
	f.write(filepath.Join("cni", "10-gpupool-e2e.conflist"), network)
	containerd, config, env := "containerd", containerdConfig(paths, PauseImage), []string(nil)
	if o.Containerd2Dir != "" {
		n.CDIDir = filepath.Join(dir, "cdi")
		containerd, config = filepath.Join(o.Containerd2Dir, "containerd"), containerd2Config(paths, PauseImage, n.CDIDir)
		// Its shim is found on PATH.
		env = []string{"PATH=" + o.Containerd2Dir + string(os.PathListSeparator) + os.Getenv("PATH")}
	}
	containerdConfigFile := f.write("containerd.toml", config)
	if f.err != nil {
		return nil, f.err
	}

	start := time.Now()
	if n.containerd, err = startProcess("containerd", containerd, env, []string{"--config", containerdConfigFile}, filepath.Join(c.dir, "containerd.log")); err != nil {
		return nil, err
	}
	if n.criConn, n.runtime, err = dialCRI(paths.socket); err != nil {
		return nil, err
	}
	if err := n.containerd.waitFor(ctx, "the CRI runtime and network to be ready", runtimeReady(n.runtime)); err != nil {
		return nil, err
	}
	pause, err := BuildProgramImage(ctx, dir, PauseImage, pausePackage)
	if err != nil {
		return nil, err
	}
	if err := n.ImportImages(ctx, pause); err != nil {
		return nil, err
	}

	if err := c.grantKubeletAPI(ctx); err != nil {
		return nil, err
	}
	ip, err := hostIP()
	if err != nil {
		return nil, err
	}
	var dns net.IP
	if o.Services {
		dns = ip
	}
	if n.kubeletCmd, err = n.kubeletCommand(paths.socket, ip, dns); err != nil {
		return nil, err
	}
	if err := n.startKubelet(ctx, start); err != nil {
		return nil, err
	}
	if o.Services {
		if err := n.startServices(ctx, ip); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// grantKubeletAPI lets the apiserver call the kubelets' API, for logs and
// exec, as kubeadm's clusters do. A node started again after another
// finds the grant there.
func (c *ControlPlane) grantKubeletAPI(ctx context.Context) error {
	_, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: apiserverKubeletClient},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:kubelet-api-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: apiserverKubeletClient}},
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// kubeletCommand writes the kubelet's certificates, kubeconfig and
// configuration, for a node at ip whose pods resolve names at dns (none
// when nil), and returns its command line.
func (n *KubeletNode) kubeletCommand(containerdSocket string, ip, dns net.IP) ([]string, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	port, healthzPort := ports[0], ports[1]
	n.healthz = "http://127.0.0.1:" + strconv.Itoa(healthzPort) + "/healthz"
	c := n.cp
	f := &files{dir: n.dir}
	caFile := f.write("ca.crt", c.CA)
	kubeconfig := f.kubeconfig("kubelet", c.URL, c.ca, leaf{
		subject: pkix.Name{CommonName: "system:node:" + n.Name, Organization: []string{"system:nodes"}},
		usages:  clientAuth,
	})
	// The apiserver reaches the kubelet at ip and checks this certificate
	// against the cluster CA.
	cert, key := f.issue(c.ca, "kubelet-serving", leaf{
		subject:  pkix.Name{CommonName: n.Name},
		dnsNames: []string{n.Name},
		ips:      []net.IP{ip},
		usages:   serverAuth,
	})
	var clusterDNS []string
	if dns != nil {
		clusterDNS = []string{dns.String()}
	}
	config, err := yaml.Marshal(kubeletconfigv1beta1.KubeletConfiguration{
		TypeMeta: metav1.TypeMeta{
			APIVersion: kubeletconfigv1beta1.SchemeGroupVersion.String(),
			Kind:       "KubeletConfiguration",
		},
		ContainerRuntimeEndpoint: "unix://" + containerdSocket,
		// The machines the tests run on have cgroup v1, which kubelets
		// from 1.35 refuse unless told otherwise; and containerd 1.6
		// cannot tell the kubelet its cgroup driver.
		FailCgroupV1:       ptr.To(false),
		CgroupDriver:       "cgroupfs",
		Address:            ip.String(),
		Port:               int32(port),
		TLSCertFile:        cert,
		TLSPrivateKeyFile:  key,
		HealthzBindAddress: "127.0.0.1",
		HealthzPort:        ptr.To(int32(healthzPort)),
		// Clients of the kubelet's API (the apiserver) present a
		// certificate from the cluster CA; the apiserver decides what
		// they may do.
		Authentication: kubeletconfigv1beta1.KubeletAuthentication{
			X509:      kubeletconfigv1beta1.KubeletX509Authentication{ClientCAFile: caFile},
			Webhook:   kubeletconfigv1beta1.KubeletWebhookAuthentication{Enabled: ptr.To(true)},
			Anonymous: kubeletconfigv1beta1.KubeletAnonymousAuthentication{Enabled: ptr.To(false)},
		},
		Authorization: kubeletconfigv1beta1.KubeletAuthorization{Mode: kubeletconfigv1beta1.KubeletAuthorizationModeWebhook},
		PodLogsDir:    filepath.Join(n.dir, "pod-logs"),
		// Volume plugins are looked for here, not under /usr/libexec.
		VolumePluginDir: filepath.Join(n.dir, "volume-plugins"),
		// The host's disk and memory are the other tests' too: the node
		// neither evicts pods nor removes images for want of them.
		EvictionHard:                map[string]string{"memory.available": "0%"},
		ImageGCHighThresholdPercent: ptr.To[int32](100),
		FailSwapOn:                  ptr.To(false),
		// No node allocatable enforcement: the node's cgroups are not
		// carved out of the host's.
		EnforceNodeAllocatable: []string{},
		// Pods resolve the cluster's names alone, if any: nothing else
		// is reachable from here.
		ResolverConfig: ptr.To(""),
		ClusterDNS:     clusterDNS,
		ClusterDomain:  ClusterDomain,
	})
	if err != nil {
		return nil, err
	}
	configFile := f.write("kubelet.yaml", config)
	if f.err != nil {
		return nil, f.err
	}
	return []string{
		filepath.Join(c.binDir, "kubelet"),
		"--config=" + configFile,
		"--kubeconfig=" + kubeconfig,
		"--root-dir=" + n.KubeletDir,
		"--cert-dir=" + filepath.Join(n.dir, "kubelet-pki"),
		"--hostname-override=" + n.Name,
		// The node's InternalIP, where the apiserver reaches the kubelet.
		"--node-ip=" + ip.String(),
	}, nil
}

// startKubelet starts the kubelet and waits until it is healthy and the
// node Ready, as reported in the second of since or later.
func (n *KubeletNode) startKubelet(ctx context.Context, since time.Time) error {
	kubelet, err := startProcess("kubelet", n.kubeletCmd[0], nil, n.kubeletCmd[1:], filepath.Join(n.cp.dir, "kubelet.log"))
	if err != nil {
		return err
	}
	n.kubelet = kubelet
	if err := kubelet.waitFor(ctx, "/healthz", getOK(http.DefaultClient, n.healthz)); err != nil {
		return err
	}
	since = since.Truncate(time.Second)
	return kubelet.waitFor(ctx, "the node to be Ready", func(ctx context.Context) error {
		node, err := n.cp.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type != corev1.NodeReady {
				continue
			}
			if cond.Status != corev1.ConditionTrue {
				return fmt.Errorf("node %s is not Ready: %s: %s", n.Name, cond.Reason, cond.Message)
			}
			if cond.LastHeartbeatTime.Time.Before(since) {
				return fmt.Errorf("node %s: no status from the kubelet since %s", n.Name, since.Format(time.RFC3339))
			}
			return nil
		}
		return fmt.Errorf("node %s has no Ready condition yet", n.Name)
	})
}

// RestartKubelet kills the kubelet and starts it again, and returns once
// it has reported the node Ready again. The pods' containers run on under
// containerd meanwhile, as when a node's kubelet is restarted.
func (n *KubeletNode) RestartKubelet(ctx context.Context) error {
	n.kubelet.stop()
	// Status times have whole seconds: a kubelet started on the next
	// second reports Ready at a time its predecessor's report cannot have.
	nextSecond := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(nextSecond))
	return n.startKubelet(ctx, nextSecond)
}

// ImportImages imports the images in the tarball at path, such as
// BuildProgramImage writes, into containerd, unpacked, where the kubelet
// finds them.
func (n *KubeletNode) ImportImages(ctx context.Context, path string) error {
	out, err := exec.CommandContext(ctx, "ctr", "--address", n.ContainerdSocket, "--namespace", "k8s.io", "images", "import", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr images import %s: %w: %s", path, err, out)
	}
	return nil
}

// Stop stops the kubelet, then every pod's containers, sandbox, mounts and
// network, then containerd, and removes containerd's state. Calling it
// again does nothing. The node object stays in the API, NotReady in time.
func (n *KubeletNode) Stop() error {
	if n.stopped {
		return nil
	}
	n.stopped = true
	if n.kubelet != nil {
		n.kubelet.stop()
	}
	errs := []error{n.stopServices()}
	if n.runtime != nil {
		// The test's context is done by the time its cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if n.containerd != nil && runtimeReady(n.runtime)(ctx) == nil {
			errs = append(errs, removePodSandboxes(ctx, n.runtime))
		}
		errs = append(errs, n.criConn.Close())
	}
	if n.containerd != nil {
		n.containerd.stop()
	}
	// The kubelet mounts its root directory on itself, and each pod's
	// volumes, and leaves them when killed.
	errs = append(errs, unmountUnder(n.dir), unmountUnder(n.state), os.RemoveAll(n.state))
	if n.lock != nil {
		errs = append(errs, n.lock.Close()) // closing the file releases its lock
	}
	return errors.Join(errs...)
}

// unmountUnder unmounts every mount at or below dir, the last mounted
// first, as mounts stack.
func unmountUnder(dir string) error {
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	// The kernel writes these four characters of a mount point in octal.
	unescape := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	var points []string
	for line := range strings.Lines(string(mountinfo)) {
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		if point := unescape.Replace(fields[4]); point == dir || strings.HasPrefix(point, dir+"/") {
			points = append(points, point)
		}
	}
	var errs []error
	for _, point := range slices.Backward(points) {
		if err := syscall.Unmount(point, 0); err != nil {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", point, err))
		}
	}
	return errors.Join(errs...)
}

// PodResourcesSocket is the kubelet's pod-resources API socket, which a
// device plugin asks which pod its devices went to.
func (n *KubeletNode) PodResourcesSocket() string {
	return filepath.Join(n.KubeletDir, "pod-resources", "kubelet.sock")
}

// Logs returns the last lines of containerd's and the kubelet's logs, and
// kube-proxy's and CoreDNS's if they run, for a failing test to print.
func (n *KubeletNode) Logs(lines int) string {
	return logTails(lines, n.containerd, n.kubelet, n.proxy, n.dns)
}

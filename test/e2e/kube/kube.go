// Package kube starts a real Kubernetes control plane on loopback for
// end-to-end tests: etcd, kube-apiserver, kube-controller-manager (with the
// HPA controller, which the tests exercise) and kwok, which plays the
// kubelets of fake nodes so that pods become Ready without containers.
// Without a scheduler, pods name their node in spec.nodeName; StartScheduler
// adds kube-scheduler, with gpupool's profile and extender, and
// StartTrainingOperator the Kubeflow training operator for TFJobs.
//
// build.sh builds the Kubernetes binaries and the operator; etcd comes from
// $PATH.
package kube

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Options configure Start.
type Options struct {
	// BinDir holds kube-apiserver, kube-controller-manager, kube-scheduler,
	// kwok and the training operator: the directory build.sh prints.
	BinDir string
	// Etcd is the etcd binary; empty means "etcd" in $PATH. Debian's
	// etcd-server 3.4 works.
	Etcd string
	// Dir receives etcd's data, the keys, certificates and kubeconfigs, and
	// each component's output in <component>.log. A t.TempDir().
	Dir string
	// HPASyncPeriod is how often the HPA controller reconciles; zero means
	// Kubernetes' default, 15s.
	HPASyncPeriod time.Duration
	// PodNetwork lets the pods of a kubelet node reach the apiserver, as
	// in-cluster clients do, at the ClusterIP of the Service "kubernetes":
	// the apiserver listens on every address and publishes this machine's
	// as that Service's endpoint, which NodeOptions.Services routes to.
	// Without it the apiserver serves loopback alone.
	PodNetwork bool
}

// ControlPlane is a running control plane.
type ControlPlane struct {
	// URL is the apiserver's: https://127.0.0.1:<port>.
	URL string
	// Kubeconfig is the path of a kubeconfig for an administrator (group
	// system:masters); Config and Client act as the same administrator.
	Kubeconfig string
	Config     *rest.Config
	Client     kubernetes.Interface
	// CA is the cluster CA's certificate (PEM). It signs the apiserver's
	// serving certificate and those that ServingCert issues.
	CA []byte

	ca      *authority
	roots   *x509.CertPool // the cluster CA, to check the components' serving certificates
	dynamic dynamic.Interface
	binDir  string
	dir     string
	procs   []*process // in the order they started
	kwok    *process
	// schedulerURL is kube-scheduler's secure port, once StartScheduler.
	schedulerURL string
}

// serviceCIDR holds the Services' ClusterIPs; the first is the Service
// "kubernetes"'s.
const serviceCIDR = "10.0.0.0/24"

var (
	kubernetesServiceIP = net.IPv4(10, 0, 0, 1)
	loopback            = []net.IP{net.IPv4(127, 0, 0, 1)}
	serverAuth          = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	clientAuth          = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
)

// Start starts etcd, kube-apiserver, kube-controller-manager and kwok, and
// returns once the apiserver is ready, the controller manager healthy and
// the ServiceAccount "default" in the namespace "default" exists (pods
// cannot be created before it does). The caller must call Stop, even if
// the test fails. On error, everything started has been stopped, and the
// error names the component that failed and ends with the tail of its log.
func Start(ctx context.Context, o Options) (_ *ControlPlane, err error) {
	if o.BinDir == "" || o.Dir == "" {
		return nil, errors.New("Options.BinDir and Options.Dir must be set")
	}
	etcdBin := o.Etcd
	if etcdBin == "" {
		if etcdBin, err = exec.LookPath("etcd"); err != nil {
			return nil, err
		}
	}
	if o.HPASyncPeriod == 0 {
		o.HPASyncPeriod = 15 * time.Second
	}
	ports, err := freePorts(4)
	if err != nil {
		return nil, err
	}
	etcdURL := "https://127.0.0.1:" + strconv.Itoa(ports[0])
	etcdPeerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	apiserverPort, kcmPort := strconv.Itoa(ports[2]), strconv.Itoa(ports[3])

	ca, err := newAuthority("gpupool-e2e-ca")
	if err != nil {
		return nil, err
	}
	// The aggregator authenticates to aggregated APIs' servers with a
	// client certificate from a CA of its own.
	frontProxyCA, err := newAuthority("gpupool-e2e-front-proxy-ca")
	if err != nil {
		return nil, err
	}
	// The apiserver signs ServiceAccount tokens with this key.
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	saKeyPEM, err := encodeKey(saKey)
	if err != nil {
		return nil, err
	}
	saPublicKeyDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, err
	}

	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	c := &ControlPlane{URL: "https://127.0.0.1:" + apiserverPort, CA: ca.certPEM, ca: ca, roots: roots, binDir: o.BinDir, dir: o.Dir}
	f := &files{dir: o.Dir}
	caFile := f.write("ca.crt", ca.certPEM)
	saKeyFile := f.write("sa.key", saKeyPEM)
	saPublicKeyFile := f.write("sa.pub", encodePEM("PUBLIC KEY", saPublicKeyDER))
	etcdCert, etcdKey := f.issue(ca, "etcd-server", leaf{
		subject:  pkix.Name{CommonName: "etcd"},
		dnsNames: []string{"localhost"},
		ips:      loopback,
		usages:   []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	})
	etcdClientCert, etcdClientKey := f.issue(ca, "apiserver-etcd-client", leaf{
		subject: pkix.Name{CommonName: "kube-apiserver-etcd-client"},
		usages:  clientAuth,
	})
	// 127.0.0.1 alone, or with PodNetwork also this machine's address,
	// where pods reach the apiserver, and the Service's ClusterIP, which
	// they dial.
	apiserverIPs := loopback
	apiserverAddress := []string{"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		// The default reconciler would publish 127.0.0.1 as the endpoint
		// of the Service "kubernetes", which validation rejects; nothing
		// here uses that Service.
		"--endpoint-reconciler-type=none"}
	if o.PodNetwork {
		ip, err := hostIP()
		if err != nil {
			return nil, err
		}
		apiserverIPs = []net.IP{loopback[0], ip, kubernetesServiceIP}
		apiserverAddress = []string{"--bind-address=0.0.0.0", "--advertise-address=" + ip.String()}
	}
	apiserverCert, apiserverKey := f.issue(ca, "apiserver", leaf{
		subject:  pkix.Name{CommonName: "kube-apiserver"},
		dnsNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		ips:      apiserverIPs,
		usages:   serverAuth,
	})
	frontProxyCAFile := f.write("front-proxy-ca.crt", frontProxyCA.certPEM)
	frontProxyCert, frontProxyKey := f.issue(frontProxyCA, "front-proxy-client", leaf{
		subject: pkix.Name{CommonName: "front-proxy-client"},
		usages:  clientAuth,
	})
	// The apiserver's identity to kubelets, for logs and exec; StartNode
	// grants it the kubelet API.
	kubeletClientCert, kubeletClientKey := f.issue(ca, "apiserver-kubelet-client", leaf{
		subject: pkix.Name{CommonName: apiserverKubeletClient},
		usages:  clientAuth,
	})
	kcmCert, kcmKey := f.issue(ca, "kube-controller-manager", leaf{
		subject: pkix.Name{CommonName: "kube-controller-manager"},
		ips:     loopback,
		usages:  serverAuth,
	})
	c.Kubeconfig = f.kubeconfig("admin", c.URL, ca, leaf{
		subject: pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		usages:  clientAuth,
	})
	kcmKubeconfig := f.kubeconfig("kube-controller-manager", c.URL, ca, leaf{
		subject: pkix.Name{CommonName: "system:kube-controller-manager"},
		usages:  clientAuth,
	})
	kwokStagesFile := f.write("kwok-stages.yaml", kwokStages)
	kwokConfigFile := f.write("kwok.yaml", kwokConfig)
	if f.err != nil {
		return nil, f.err
	}

	if c.Config, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig); err != nil {
		return nil, err
	}
	// client-go's default, 5 requests a second, slows tests that poll, and
	// would hold back those that create pods and nodes by the thousand.
	c.Config.QPS, c.Config.Burst = 1000, 2000
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return nil, err
	}
	if c.dynamic, err = dynamic.NewForConfig(c.Config); err != nil {
		return nil, err
	}
	apiserverClient, err := rest.HTTPClientFor(c.Config)
	if err != nil {
		return nil, err
	}
	etcdClientPair, err := tls.LoadX509KeyPair(etcdClientCert, etcdClientKey)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()

	etcd, err := c.start("etcd", etcdBin, nil,
		"--name=e2e",
		"--data-dir="+filepath.Join(o.Dir, "etcd"),
		"--listen-client-urls="+etcdURL,
		"--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+etcdPeerURL,
		"--initial-advertise-peer-urls="+etcdPeerURL,
		"--initial-cluster=e2e="+etcdPeerURL,
		"--cert-file="+etcdCert,
		"--key-file="+etcdKey,
		"--trusted-ca-file="+caFile,
		"--client-cert-auth",
	)
	if err != nil {
		return nil, err
	}
	if err := etcd.waitFor(ctx, "/health", getOK(httpsClient(roots, etcdClientPair), etcdURL+"/health")); err != nil {
		return nil, err
	}

	apiserver, err := c.start("kube-apiserver", filepath.Join(o.BinDir, "kube-apiserver"), nil, append(apiserverAddress,
		"--secure-port="+apiserverPort,
		"--tls-cert-file="+apiserverCert,
		"--tls-private-key-file="+apiserverKey,
		"--client-ca-file="+caFile,
		// As in clusters kubeadm sets up: the Node authorizer lets a
		// kubelet (system:node:<name>) read what its own pods use, and
		// NodeRestriction keeps it from writing other nodes and pods.
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		// A kubelet's node is reached at its InternalIP; its name
		// resolves nowhere. Its serving certificate comes from the
		// cluster CA, which the apiserver checks.
		"--kubelet-preferred-address-types=InternalIP",
		"--kubelet-certificate-authority="+caFile,
		"--kubelet-client-certificate="+kubeletClientCert,
		"--kubelet-client-key="+kubeletClientKey,
		"--etcd-servers="+etcdURL,
		"--etcd-cafile="+caFile,
		"--etcd-certfile="+etcdClientCert,
		"--etcd-keyfile="+etcdClientKey,
		// With WatchList on, the apiserver serves every watch from
		// resourceVersion "" or "0" as a watch-list stream, which needs
		// etcd's RequestWatchProgress (etcd 3.4.31 or 3.5.13 and later).
		// With older etcd, such as Debian's 3.4.23, it fails those
		// watches, and clients that make them, such as kwok, see events
		// seconds late, between retries.
		"--feature-gates=WatchList=false",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+saPublicKeyFile,
		"--service-account-signing-key-file="+saKeyFile,
		"--service-cluster-ip-range="+serviceCIDR,
		// The aggregator's identity when it proxies to aggregated APIs.
		"--proxy-client-cert-file="+frontProxyCert,
		"--proxy-client-key-file="+frontProxyKey,
		"--requestheader-client-ca-file="+frontProxyCAFile,
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
	)...)
	if err != nil {
		return nil, err
	}
	if err := apiserver.waitFor(ctx, "/readyz", getOK(apiserverClient, c.URL+"/readyz")); err != nil {
		return nil, err
	}

	kcm, err := c.start("kube-controller-manager", filepath.Join(o.BinDir, "kube-controller-manager"), nil,
		"--kubeconfig="+kcmKubeconfig,
		"--authentication-kubeconfig="+kcmKubeconfig,
		"--authorization-kubeconfig="+kcmKubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port="+kcmPort,
		"--tls-cert-file="+kcmCert,
		"--tls-private-key-file="+kcmKey,
		"--leader-elect=false",
		"--cluster-name=gpupool-e2e",
		"--root-ca-file="+caFile,
		"--service-account-private-key-file="+saKeyFile,
		// Each controller acts as its own ServiceAccount, as in real
		// clusters: the HPA controller reads the metrics APIs as
		// system:serviceaccount:kube-system:horizontal-pod-autoscaler,
		// which RBAC must allow.
		"--use-service-account-credentials=true",
		// The HPA's initial-readiness-delay and cpu-initialization-period
		// apply to CPU resource metrics only, so their defaults stay.
		"--horizontal-pod-autoscaler-sync-period="+o.HPASyncPeriod.String(),
		// A node is NotReady once its lease has not been renewed for this
		// long; kwok renews them four times as often.
		"--node-monitor-grace-period="+nodeLeaseDuration.String(),
		// The quota controller recounts a quota when a pod goes, from its
		// pod cache; one created a moment before may be missing from it,
		// and the count it writes too low until the next full recount
		// (5 minutes by default). Within a test's wait, then.
		"--resource-quota-sync-period=10s",
		// The node lifecycle controller lifts each new node's not-ready
		// taint with a PATCH, at the client's default 20 requests a
		// second: 1,213 kwok nodes were Ready long before they were
		// schedulable (365 still tainted 85 s after the last was Ready).
		"--kube-api-qps=400",
		"--kube-api-burst=800",
	)
	if err != nil {
		return nil, err
	}
	c.kwok, err = c.start("kwok", filepath.Join(o.BinDir, "kwok"), nil,
		"--kubeconfig="+c.Kubeconfig,
		"--config="+kwokStagesFile,
		"--config="+kwokConfigFile,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector="+kwokNodeKey+"=fake",
		// kwok renews the nodes' leases, as kubelets do. Without leases
		// the node lifecycle controller would find the nodes silent, and
		// mark them and their pods not Ready.
		"--node-lease-duration-seconds="+strconv.Itoa(int(nodeLeaseDuration.Seconds())),
		"--cidr=10.0.1.0/24",
		"--node-ip=10.0.1.1",
	)
	if err != nil {
		return nil, err
	}
	kcmHealthz := "https://127.0.0.1:" + kcmPort + "/healthz"
	if err := kcm.waitFor(ctx, "/healthz", getOK(httpsClient(roots), kcmHealthz)); err != nil {
		return nil, err
	}
	defaultServiceAccount := func(ctx context.Context) error {
		_, err := c.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	}
	if err := kcm.waitFor(ctx, "the ServiceAccount default/default", defaultServiceAccount); err != nil {
		return nil, err
	}
	return c, nil
}

// Stop kills the components, the last started first, and waits for them
// to exit. Calling it again does nothing.
func (c *ControlPlane) Stop() {
	for _, p := range slices.Backward(c.procs) {
		p.stop()
	}
}

// Logs returns the last lines of each component's log, for a failing test
// to print.
func (c *ControlPlane) Logs(lines int) string {
	return logTails(lines, c.procs...)
}

// Log is the whole log of the component started as name.
func (c *ControlPlane) Log(name string) ([]byte, error) {
	return os.ReadFile(filepath.Join(c.dir, name+".log"))
}

// PID is the process ID of the component started as name ("etcd",
// "kube-apiserver", "kube-scheduler", ...), or 0 when none was; a
// benchmark reads the component's CPU time and peak memory from /proc.
func (c *ControlPlane) PID(name string) int {
	for _, p := range c.procs {
		if p.name == name {
			return p.cmd.Process.Pid
		}
	}
	return 0
}

// ServingCert issues a key and a certificate signed by the cluster CA for a
// server the apiserver connects to, such as an aggregated API's. The
// aggregator checks the name <service>.<namespace>.svc, so dnsNames must
// include it. The certificate is valid for 127.0.0.1 too, for tests that
// call the server directly.
func (c *ControlPlane) ServingCert(dnsNames ...string) (certPEM, keyPEM []byte, err error) {
	return c.ca.issue(leaf{dnsNames: dnsNames, ips: loopback, usages: serverAuth})
}

// start starts a component, its output going to <name>.log in c.dir, with
// env (NAME=value) added to this process's environment.
func (c *ControlPlane) start(name, bin string, env []string, args ...string) (*process, error) {
	p, err := startProcess(name, bin, env, args, filepath.Join(c.dir, name+".log"))
	if err != nil {
		return nil, err
	}
	c.procs = append(c.procs, p)
	return p, nil
}

// freePorts returns n loopback ports that were free a moment ago. Another
// process may take one first; the component that wanted it then exits,
// saying so, and Start fails with its log.
func freePorts(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer func() { _ = l.Close() }()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

// httpsClient trusts roots and presents certs.
func httpsClient(roots *x509.CertPool, certs ...tls.Certificate) *http.Client {
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: certs},
	}}
}

package kube

import (
	"context"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ClusterDomain is the DNS domain of the Services of a node started with
// NodeOptions.Services: <service>.<namespace>.svc.cluster.local.
const ClusterDomain = "cluster.local"

// coreDNSUser is CoreDNS's identity, granted what kubeadm grants the
// ClusterRole system:coredns.
const coreDNSUser = "system:coredns"

var coreDNSRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
}

// startServices starts what makes Services work for the node's pods and
// for the apiserver, as a cluster's add-ons do: kube-proxy in iptables
// mode, as system:kube-proxy (bound to system:node-proxier by the
// apiserver's default policy), which routes ClusterIPs to endpoints from
// the host and from the pods' bridge; and CoreDNS with its kubernetes
// plugin, serving the Services' names on ip, the node's address, which
// the kubelet gives the pods as their DNS server. Both run on the host, as
// the kubelet does.
func (n *KubeletNode) startServices(ctx context.Context, ip net.IP) error {
	c := n.cp
	f := &files{dir: n.dir}
	proxyKubeconfig := f.kubeconfig("kube-proxy", c.URL, c.ca, leaf{subject: pkix.Name{CommonName: "system:kube-proxy"}, usages: clientAuth})
	dnsKubeconfig := f.kubeconfig("coredns", c.URL, c.ca, leaf{subject: pkix.Name{CommonName: coreDNSUser}, usages: clientAuth})
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	proxyHealthz, proxyMetrics, dnsReady := "127.0.0.1:"+strconv.Itoa(ports[0]), "127.0.0.1:"+strconv.Itoa(ports[1]), "127.0.0.1:"+strconv.Itoa(ports[2])
	// A plugin added here is imported in coredns/main.go too.
	corefile := f.write("Corefile", fmt.Appendf(nil, `.:53 {
    bind %s
    errors
    ready %s
    kubernetes %s in-addr.arpa ip6.arpa {
        kubeconfig %s e2e
        fallthrough in-addr.arpa ip6.arpa
    }
}
`, ip, dnsReady, ClusterDomain, dnsKubeconfig))
	if f.err != nil {
		return f.err
	}

	if n.proxy, err = startProcess("kube-proxy", filepath.Join(c.binDir, "kube-proxy"), nil, []string{
		"--kubeconfig=" + proxyKubeconfig,
		"--hostname-override=" + n.Name,
		"--proxy-mode=iptables",
		// Traffic to a ClusterIP from outside the pods' network is
		// masqueraded, so that its replies come back through the host.
		"--cluster-cidr=" + podCIDR,
		"--healthz-bind-address=" + proxyHealthz,
		"--metrics-bind-address=" + proxyMetrics,
		// The machine's conntrack settings are the other tests' too:
		// kube-proxy leaves them as they are.
		"--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
	}, filepath.Join(c.dir, "kube-proxy.log")); err != nil {
		return err
	}
	// 200 once the rules of every Service and endpoint are written.
	if err := n.proxy.waitFor(ctx, "/healthz", getOK(http.DefaultClient, "http://"+proxyHealthz+"/healthz")); err != nil {
		return err
	}

	if err := c.grant(ctx, coreDNSUser, coreDNSRules); err != nil {
		return err
	}
	if n.dns, err = startProcess("coredns", filepath.Join(c.binDir, "coredns"), nil, []string{"-conf", corefile}, filepath.Join(c.dir, "coredns.log")); err != nil {
		return err
	}
	// 200 once the kubernetes plugin has listed the Services.
	return n.dns.waitFor(ctx, "/ready", getOK(http.DefaultClient, "http://"+dnsReady+"/ready"))
}

// stopServices stops CoreDNS and kube-proxy, and removes kube-proxy's
// rules, which would otherwise outlive it in the host's tables.
func (n *KubeletNode) stopServices() error {
	if n.dns != nil {
		n.dns.stop()
	}
	if n.proxy == nil {
		return nil
	}
	n.proxy.stop()
	if out, err := exec.Command(filepath.Join(n.cp.binDir, "kube-proxy"), "--cleanup", "--proxy-mode=iptables").CombinedOutput(); err != nil {
		return fmt.Errorf("kube-proxy --cleanup: %w: %s", err, out)
	}
	return nil
}

// grant gives user the rules across the cluster, under a ClusterRole and a
// ClusterRoleBinding of the user's name. A node started again after
// another finds them there.
func (c *ControlPlane) grant(ctx context.Context, user string, rules []rbacv1.PolicyRule) error {
	rbac := c.Client.RbacV1()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: rules}
	if _, err := rbac.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

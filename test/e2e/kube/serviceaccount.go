package kube

import (
	"context"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

// ServiceAccountKubeconfig writes a kubeconfig that acts as the
// ServiceAccount namespace/name, with a token kube-apiserver issues for it
// (valid for an hour): what a pod running as that ServiceAccount gets from
// its in-cluster config, for a process the test runs outside a pod. It
// returns the file's path.
func (c *ControlPlane) ServiceAccountKubeconfig(ctx context.Context, namespace, name string) (string, error) {
	token, err := c.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	user := namespace + ":" + name
	data, err := clientcmd.Write(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"e2e": {Server: c.URL, CertificateAuthorityData: c.CA}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{user: {Token: token.Status.Token}},
		Contexts:       map[string]*clientcmdapi.Context{"e2e": {Cluster: "e2e", AuthInfo: user}},
		CurrentContext: "e2e",
	})
	if err != nil {
		return "", err
	}
	f := &files{dir: c.dir}
	path := f.write("serviceaccount-"+namespace+"-"+name+".kubeconfig", data)
	return path, f.err
}

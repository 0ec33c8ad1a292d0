// Command coredns is the cluster DNS of the end-to-end tests whose
// components run as pods (test/e2e/kube's KubeletNode): CoreDNS with the
// plugins their Corefile uses and no others. CoreDNS's own main links
// every plugin, and with them the SDKs of three clouds, most of what its
// build compiles.
package main

import (
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() { coremain.Run() }

// Command postrender is a helm post-renderer that builds the chart's
// manifests through a kustomization, as platform teams patch a chart for
// their cluster:
//
//	helm install ... --post-renderer postrender --post-renderer-args DIR
//
// DIR's kustomization.yaml lists helm.yaml among its resources; postrender
// writes what helm rendered (its standard input) there, and prints
// kustomize's build of DIR. TestHelmChart applies the end-to-end tests'
// simulated GPUs with it.
package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: postrender DIR < manifests (DIR/kustomization.yaml lists helm.yaml)")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "postrender: %v\n", err)
		os.Exit(1)
	}
}

func run(dir string, in io.Reader, out io.Writer) error {
	rendered, err := io.ReadAll(in)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "helm.yaml"), rendered, 0o600); err != nil {
		return err
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return err
	}
	b, err := m.AsYaml()
	if err != nil {
		return err
	}
	_, err = out.Write(b)
	return err
}

package adapter

import (
	"fmt"
	"maps"
	"net"

	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	openapicommon "k8s.io/kube-openapi/pkg/common"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/apiserver"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/cmd/options"
	generatedcore "sigs.k8s.io/custom-metrics-apiserver/pkg/generated/openapi/core"
	generatedexternal "sigs.k8s.io/custom-metrics-apiserver/pkg/generated/openapi/externalmetrics"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/provider"
)

// Name is the adapter's name in its OpenAPI document and logs.
const Name = "gpupool-adapter"

// NewServer builds the external-metrics API server for p, with
// custom-metrics-apiserver's serving options (o.AddFlags gives their
// flags). With kube set, requests are authenticated and authorized by
// delegation to that cluster's kube-apiserver, as in any aggregated API;
// with kube nil there is no cluster to ask and every request is served
// (loopback demos only: the caller must say so).
func NewServer(o *options.CustomMetricsAdapterServerOptions, kube *rest.Config, p provider.ExternalMetricsProvider) (*apiserver.CustomMetricsAdapterServer, error) {
	defs := func(ref openapicommon.ReferenceCallback) map[string]openapicommon.OpenAPIDefinition {
		out := generatedcore.GetOpenAPIDefinitions(ref)
		maps.Copy(out, generatedexternal.GetOpenAPIDefinitions(ref))
		return out
	}
	namer := openapinamer.NewDefinitionNamer(apiserver.Scheme)
	o.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(defs, namer)
	o.OpenAPIConfig.Info.Title, o.OpenAPIConfig.Info.Version = Name, "1.0.0"
	o.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(defs, namer)
	o.OpenAPIV3Config.Info.Title, o.OpenAPIV3Config.Info.Version = Name, "1.0.0"
	if errs := o.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("serving options: %v", errs)
	}

	cfg := genericapiserver.NewRecommendedConfig(apiserver.Codecs)
	if kube != nil {
		clientset, err := kubernetes.NewForConfig(kube)
		if err != nil {
			return nil, err
		}
		cfg.ClientConfig = kube
		cfg.SharedInformerFactory = informers.NewSharedInformerFactory(clientset, 0)
		if err := o.ApplyTo(cfg); err != nil {
			return nil, err
		}
	} else {
		if err := SelfSignedCert(o); err != nil {
			return nil, err
		}
		if err := o.SecureServing.ApplyTo(&cfg.SecureServing, &cfg.LoopbackClientConfig); err != nil {
			return nil, err
		}
		cfg.OpenAPIConfig, cfg.OpenAPIV3Config = o.OpenAPIConfig, o.OpenAPIV3Config
	}
	c := apiserver.Config{GenericConfig: &cfg.Config}
	return c.Complete(cfg.SharedInformerFactory).New(Name, nil, p)
}

// SelfSignedCert has o serve a certificate for localhost and 127.0.0.1,
// signed by a CA of its own, which it writes to o's certificate directory
// and names in o, unless o names a certificate already. NewServer does so
// without a cluster; a client on loopback calls it first, then trusts the
// certificate file o names.
func SelfSignedCert(o *options.CustomMetricsAdapterServerOptions) error {
	if err := o.SecureServing.MaybeDefaultWithSelfSignedCerts("localhost", nil, []net.IP{net.ParseIP("127.0.0.1")}); err != nil {
		return fmt.Errorf("self-signed serving certificate: %w", err)
	}
	return nil
}

package kube

import (
	"context"
	"encoding/base64"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// apiServices is the resource of APIServices. They are handled as
// unstructured objects, which spares a dependency on k8s.io/kube-aggregator.
var apiServices = schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}

// RegisterAPIService has the apiserver serve group/version by proxying to
// a server on 127.0.0.1:port, as it would to the Service namespace/service
// in a real cluster. It creates the namespace if missing, the Service, of
// type ExternalName pointing to localhost (the aggregator resolves it
// without kube-proxy or endpoints), and the APIService <version>.<group>,
// which trusts the cluster CA. The server must present a certificate for
// <service>.<namespace>.svc, the name the aggregator checks, such as
// ServingCert issues.
func (c *ControlPlane) RegisterAPIService(ctx context.Context, group, version, namespace, service string, port int32) error {
	if err := c.LocalService(ctx, namespace, service, port); err != nil {
		return err
	}
	apiService := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1",
		"kind":       "APIService",
		"metadata":   map[string]any{"name": version + "." + group},
		"spec": map[string]any{
			"group":                group,
			"version":              version,
			"service":              map[string]any{"namespace": namespace, "name": service, "port": int64(port)},
			"caBundle":             base64.StdEncoding.EncodeToString(c.CA),
			"groupPriorityMinimum": int64(100),
			"versionPriority":      int64(100),
		},
	}}
	_, err := c.dynamic.Resource(apiServices).Create(ctx, apiService, metav1.CreateOptions{})
	return err
}

// LocalService creates the namespace if missing, and the Service
// namespace/service, of type ExternalName pointing to localhost, which the
// apiserver resolves to 127.0.0.1:port without kube-proxy or endpoints,
// when it calls an aggregated API's server or a webhook.
func (c *ControlPlane) LocalService(ctx context.Context, namespace, service string, port int32) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: service, Namespace: namespace},
		Spec: corev1.ServiceSpec{
			Type:         corev1.ServiceTypeExternalName,
			ExternalName: "localhost",
			Ports:        []corev1.ServicePort{{Port: port}},
		},
	}
	_, err := c.Client.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{})
	return err
}

// WaitAPIServiceAvailable waits until the APIService name (<version>.<group>)
// is Available: the aggregator has reached its server and had an answer
// to discovery. If it is not, the error gives the condition's reason and
// message, such as the aggregator's error from the server.
func (c *ControlPlane) WaitAPIServiceAvailable(ctx context.Context, name string) error {
	if err := c.waitCondition(ctx, apiServices, name, "Available"); err != nil {
		return fmt.Errorf("APIService %s: %w", name, err)
	}
	return nil
}

// waitCondition waits until the object name of resource has the status
// condition conditionType True. If it does not, the error gives the
// condition's reason and message.
func (c *ControlPlane) waitCondition(ctx context.Context, resource schema.GroupVersionResource, name, conditionType string) error {
	return poll(ctx, nil, func(ctx context.Context) error {
		obj, err := c.dynamic.Resource(resource).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		conditions, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
		for _, cond := range conditions {
			cond, _ := cond.(map[string]any)
			if cond["type"] != conditionType {
				continue
			}
			if cond["status"] == "True" {
				return nil
			}
			return fmt.Errorf("condition %s is %v: %v: %v", conditionType, cond["status"], cond["reason"], cond["message"])
		}
		return fmt.Errorf("no %s condition yet", conditionType)
	})
}

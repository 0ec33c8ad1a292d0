package kube

import (
	"context"
	"encoding/base64"
	"errors"
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
	if _, err := c.Client.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
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

// WaitAPIServiceAvailable waits until the APIService name (<version>.<group>)
// is Available: the aggregator has reached its server and had an answer
// to discovery. If it is not, the error gives the condition's reason and
// message, such as the aggregator's error from the server.
func (c *ControlPlane) WaitAPIServiceAvailable(ctx context.Context, name string) error {
	err := poll(ctx, nil, func(ctx context.Context) error {
		obj, err := c.dynamic.Resource(apiServices).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		conditions, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
		for _, cond := range conditions {
			cond, _ := cond.(map[string]any)
			if cond["type"] != "Available" {
				continue
			}
			if cond["status"] == "True" {
				return nil
			}
			return fmt.Errorf("condition Available is %v: %v: %v", cond["status"], cond["reason"], cond["message"])
		}
		return errors.New("no Available condition yet")
	})
	if err != nil {
		return fmt.Errorf("APIService %s: %w", name, err)
	}
	return nil
}

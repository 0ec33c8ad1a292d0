package deploy_test

import (
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// kedaScaler is where examples/tf-training-keda's ScaledObject dials the
// adapter's external scaler, and the Secret its ClusterTriggerAuthentication
// reads in KEDA's namespace.
func kedaScaler(t *testing.T) (host, port, secret string) {
	t.Helper()
	objs := build(t, "examples/tf-training-keda")
	var so struct {
		Spec struct {
			Triggers []struct {
				Metadata map[string]string
			}
		}
	}
	find(t, objs, "ScaledObject", "tf-training", &so)
	host, port, err := net.SplitHostPort(so.Spec.Triggers[0].Metadata["scalerAddress"])
	if err != nil {
		t.Fatal(err)
	}
	var auth struct {
		Spec struct {
			SecretTargetRef []struct{ Parameter, Name, Key string }
		}
	}
	find(t, objs, "ClusterTriggerAuthentication", "gpupool-adapter", &auth)
	for _, ref := range auth.Spec.SecretTargetRef {
		if secret != "" && ref.Name != secret {
			t.Fatalf("the ClusterTriggerAuthentication reads Secrets %s and %s, want one", secret, ref.Name)
		}
		secret = ref.Name
	}
	return host, port, secret
}

// checkScalerServed: the adapter's Deployment in objs serves KEDA's
// external scaler on the port the example dials, through the Service it
// names, with the serving certificate, trusting as KEDA's clients the CA
// that signed that certificate (ca.crt of its Secret, alone), on the
// direct backend the scaler needs.
func checkScalerServed(t *testing.T, what string, objs []*unstructured.Unstructured) {
	t.Helper()
	host, port, _ := kedaScaler(t)
	service, namespace, _ := strings.Cut(strings.TrimSuffix(host, ".svc"), ".")
	var p int32
	if _, err := fmt.Sscan(port, &p); err != nil {
		t.Fatal(err)
	}
	served := serving(t, objs, namespace, service, p, "gpupool-adapter")
	var d appsv1.Deployment
	find(t, objs, "Deployment", "gpupool-adapter", &d)
	c := d.Spec.Template.Spec.Containers[0]
	for _, want := range []string{"--keda-scaler-listen=:" + port, "--backend=direct"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("%s: the adapter runs %q, without %s", what, c.Args, want)
		}
	}
	if !slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool {
		return cp.Name == "keda-scaler" && fmt.Sprint(cp.ContainerPort) == port
	}) {
		t.Errorf("%s: the adapter's ports %+v, want keda-scaler on %s", what, c.Ports, port)
	}
	var svc corev1.Service
	find(t, objs, "Service", service, &svc)
	if i := slices.IndexFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool { return sp.Port == p }); i < 0 ||
		svc.Spec.Ports[i].TargetPort.StrVal != "keda-scaler" || svc.Spec.Ports[i].AppProtocol == nil || *svc.Spec.Ports[i].AppProtocol != "grpc" {
		t.Errorf("%s: Service %s's ports %+v, want %s to keda-scaler, appProtocol grpc", what, service, svc.Spec.Ports, port)
	}
	var caFile string
	for _, a := range c.Args {
		if f, ok := strings.CutPrefix(a, "--keda-client-ca="); ok {
			caFile = f
		}
	}
	if caFile == "" {
		t.Fatalf("%s: the adapter runs %q, without --keda-client-ca", what, c.Args)
	}
	ca := mountedSecret(t, d.Spec.Template.Spec, filepath.Dir(caFile))
	for _, v := range d.Spec.Template.Spec.Volumes {
		if s := v.Secret; s != nil && s.SecretName == ca.secret && slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == v.Name && m.MountPath == ca.mountPath }) &&
			(len(s.Items) != 1 || s.Items[0].Key != "ca.crt" || s.Items[0].Path != filepath.Base(caFile)) {
			t.Errorf("%s: --keda-client-ca=%s is volume %s, %+v, want ca.crt alone", what, caFile, v.Name, s)
		}
	}
	if ca.secret != served.secret {
		t.Errorf("%s: KEDA's clients are checked against %s, the scaler serves %s: want the CA that issues both", what, ca.secret, served.secret)
	}
}

// TestKedaScalerInTheOverlays: every overlay serves KEDA's external scaler
// as the example dials it; with cert-manager, the adapter's certificate is
// issued for the name KEDA dials, and KEDA's client certificate, by the
// same CA, into the Secret the example reads.
func TestKedaScalerInTheOverlays(t *testing.T) {
	for _, dir := range []string{"overlays/embedded", "overlays/etcd", "overlays/full"} {
		checkScalerServed(t, dir, build(t, dir))
	}
	objs := build(t, "overlays/full")
	host, port, secret := kedaScaler(t)
	served := serving(t, objs, "gpupool", "gpupool-adapter", 443, "gpupool-adapter")
	checkCertificate(t, objs, "gpupool-adapter", served, "server auth", host)
	checkCertificate(t, objs, secret, servedSecret{secret: secret}, "client auth")
	var certs []struct {
		Metadata struct{ Name string }
		Spec     struct{ IssuerRef struct{ Kind, Name string } }
	}
	for _, name := range []string{"gpupool-adapter", secret} {
		var c struct {
			Metadata struct{ Name string }
			Spec     struct{ IssuerRef struct{ Kind, Name string } }
		}
		find(t, objs, "Certificate", name, &c)
		certs = append(certs, c)
	}
	if certs[0].Spec.IssuerRef != certs[1].Spec.IssuerRef {
		t.Errorf("the adapter's certificate is issued by %+v, KEDA's by %+v: ca.crt of %s would not check the scaler at %s:%s", certs[0].Spec.IssuerRef, certs[1].Spec.IssuerRef, secret, host, port)
	}
}

// TestKedaScalerInTheChart: the chart serves KEDA's external scaler
// whatever the values, and its hook Job copies KEDA's client certificate
// into adapter.kedaNamespace, allowed that one Secret there (and, with
// cert-manager, to read the original and its Certificate); an empty
// namespace copies nothing; NOTES.txt says where KEDA finds the scaler and
// the Secret.
func TestKedaScalerInTheChart(t *testing.T) {
	const certManager = "cert-manager.io/v1"
	_, _, secret := kedaScaler(t)
	for _, tc := range []struct {
		vals     map[string]any
		apis     []string
		copiesTo string
	}{
		{vals: nil, copiesTo: "keda"},
		{vals: map[string]any{"adapter": map[string]any{"kedaNamespace": "autoscaling"}}, copiesTo: "autoscaling"},
		{vals: map[string]any{"adapter": map[string]any{"kedaNamespace": ""}}},
		{vals: map[string]any{"controller": map[string]any{"replicas": 3}, "scheduler": map[string]any{"enabled": true}}, apis: []string{certManager}, copiesTo: "keda"},
	} {
		what := fmt.Sprintf("values %v, APIs %v", tc.vals, tc.apis)
		objs, err := renderChart(t, tc.vals, tc.apis...)
		if err != nil {
			t.Fatal(err)
		}
		checkScalerServed(t, what, objs)
		job := find1(t, objs, "Job", "gpupool-secrets")
		pod, _ := podSpec(t, job)
		args := pod.Containers[0].Args
		if copies := slices.Contains(args, "--keda-namespace="+tc.copiesTo); copies != (tc.copiesTo != "") ||
			tc.copiesTo == "" && slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--keda-namespace") }) {
			t.Errorf("%s: the Job runs %q, want it to copy %s to %q", what, args, secret, tc.copiesTo)
		}
		var elsewhere []string
		for _, o := range objs {
			// kube-system holds the API servers' RoleBindings.
			if !slices.Contains([]string{"", "gpupool", "kube-system"}, o.GetNamespace()) {
				elsewhere = append(elsewhere, o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName())
			}
		}
		var want []string
		if tc.copiesTo != "" {
			want = []string{"Role/" + tc.copiesTo + "/gpupool-secrets", "RoleBinding/" + tc.copiesTo + "/gpupool-secrets"}
		}
		if !slices.Equal(elsewhere, want) {
			t.Errorf("%s: outside gpupool the chart makes %q, want %q", what, elsewhere, want)
		}
		if tc.copiesTo != "" {
			var role rbacv1.Role
			for _, o := range objs {
				if o.GetKind() == "Role" && o.GetNamespace() == tc.copiesTo {
					if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &role); err != nil {
						t.Fatal(err)
					}
				}
			}
			if !allows(role, "", "secrets", secret, "update") || !allows(role, "", "secrets", "", "create") || allows(role, "", "secrets", "keda-operator-certs", "get") {
				t.Errorf("%s: the Job's Role in %s allows %+v, want create and %s alone", what, tc.copiesTo, role.Rules, secret)
			}
			var own rbacv1.Role
			for _, o := range objs {
				if o.GetKind() == "Role" && o.GetNamespace() == "gpupool" && o.GetName() == "gpupool-secrets" {
					if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &own); err != nil {
						t.Fatal(err)
					}
				}
			}
			withCertManager := slices.Contains(tc.apis, certManager)
			if !allows(own, "", "secrets", secret, "get") || allows(own, "cert-manager.io", "certificates", secret, "get") != withCertManager {
				t.Errorf("%s: the Job's Role in gpupool allows %+v: it reads %s, and its Certificate with cert-manager alone", what, own.Rules, secret)
			}
		}
	}
	if _, err := renderChart(t, map[string]any{"adapter": map[string]any{"kedaNamespace": "gpupool"}}); err == nil || !strings.Contains(err.Error(), "adapter.kedaNamespace gpupool") {
		t.Errorf("adapter.kedaNamespace gpupool: %v, want an error naming it", err)
	}
	if _, err := renderChart(t, map[string]any{"adapter": map[string]any{"kedaNamespace": "KEDA"}}); err == nil || !strings.Contains(err.Error(), "/adapter/kedaNamespace") {
		t.Errorf("adapter.kedaNamespace KEDA: %v, want the schema to refuse it", err)
	}
	notes := renderNotes(t, nil)
	for _, want := range []string{"gpupool-adapter.gpupool.svc:9471", "keda/" + secret} {
		if !strings.Contains(notes, want) {
			t.Errorf("NOTES.txt does not say %s:\n%s", want, notes)
		}
	}
}

// allows says whether role lets its subject verb the resource of group
// named name (empty: any name, as create is asked).
func allows(role rbacv1.Role, group, resource, name, verb string) bool {
	return slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool {
		return slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) &&
			(len(r.ResourceNames) == 0 || name != "" && slices.Contains(r.ResourceNames, name))
	})
}

// renderNotes is the chart's NOTES.txt with vals, as helm template sees it.
func renderNotes(t *testing.T, vals map[string]any) string {
	t.Helper()
	ch, err := loader.Load("helm/gpupool")
	if err != nil {
		t.Fatal(err)
	}
	values, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "bf-cluster", Namespace: "gpupool", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Render(ch, values)
	if err != nil {
		t.Fatal(err)
	}
	return files["gpupool/templates/NOTES.txt"]
}

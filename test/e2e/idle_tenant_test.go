package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/gpupool/gpupool/kube"
	e2ekube "github.com/gpupool/gpupool/test/e2e/kube"
)

// TestIdlePolicyIsThePlatformTeams: through kube-apiserver, with the
// overlay's gpupool-idle-exemptions policy and RBAC as a cluster has them,
// a namespace member (a ServiceAccount token bound to the stock edit role)
// can neither change the idle policy (the allocator's config Secret, the
// namespace) nor exempt a pod from it, on the pod, in a workload's pod
// template or in a CronJob's, nor remove an exemption; the platform team,
// granted gpupool-idle-exemptions in the namespace, can, and the pods the
// controllers stamp from its template are admitted. The member resumes
// what the policy suspended with gpupool resume and the member's own
// kubeconfig.
func TestIdlePolicyIsThePlatformTeams(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cp, _ := startControlPlane(ctx, t, nil)
	admin := cp.Client
	objs, err := kustomizeBuild(filepath.Join(deployDir, "overlays", "full"))
	if err != nil {
		t.Fatal(err)
	}
	v := newValidator(t, cp.Config)
	for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterRole"} {
		if err := v.create(ctx, find(t, objs, kind, "gpupool-idle-exemptions"), false); err != nil {
			t.Fatalf("%s gpupool-idle-exemptions: %v", kind, err)
		}
	}
	for _, ns := range []string{"ml", "gpupool"} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Where the chart keeps the idle policy: the allocator's config.
	config := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "gpupool-allocator-config", Namespace: "gpupool"},
		StringData: map[string]string{"config.yaml": "namespaces:\n  ml:\n    idle: {useBelow: 0.1, window: 30m, grace: 15m, action: reclaim}\n"}}
	if _, err := admin.CoreV1().Secrets("gpupool").Create(ctx, config, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	member, memberKubeconfig := serviceAccountUser(t, ctx, cp, "ml", "alice", "edit")
	platform, _ := serviceAccountUser(t, ctx, cp, "ml", "platform", "edit", "gpupool-idle-exemptions")
	aliceName := "system:serviceaccount:ml:alice"

	exempt := map[string]string{kube.AnnotationIdleExempt: "the lab's demo"}
	pod := func(name string, annotations map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations, Labels: map[string]string{"app": name}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "notebook:v1"}}}}
	}
	template := func(app string, annotations map[string]string) corev1.PodTemplateSpec {
		p := pod(app, annotations)
		p.Spec.RestartPolicy = corev1.RestartPolicyNever
		return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: p.Labels, Annotations: annotations}, Spec: p.Spec}
	}
	deployment := func(name string, annotations map[string]string) *appsv1.Deployment {
		tpl := template(name, annotations)
		tpl.Spec.RestartPolicy = corev1.RestartPolicyAlways
		return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: tpl.Labels}, Template: tpl}}
	}
	// The ServiceAccount admission plugin waits for ml's default account.
	waitFor(t, func() bool {
		_, err := admin.CoreV1().ServiceAccounts("ml").Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	})

	refused := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("the member: %s: %v; want it forbidden: %s", what, err, want)
		}
	}
	byPolicy := "ValidatingAdmissionPolicy 'gpupool-idle-exemptions' with binding 'gpupool-idle-exemptions' denied request: " +
		"metadata.annotations[gpupool.io/idle-exempt]: only the platform team grants an idle exemption: " + aliceName +
		" may not grant on idleexemptions.gpupool.io in namespace ml (the ClusterRole gpupool-idle-exemptions)"

	// kube-apiserver loads policies asynchronously: wait for it to refuse.
	waitForUpTo(t, 30*time.Second, func() bool {
		_, err := member.CoreV1().Pods("ml").Create(ctx, pod("probe", exempt), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsForbidden(err)
	})

	// The policy itself: the allocator's config, and the namespace.
	_, err = member.CoreV1().Secrets("gpupool").Patch(ctx, "gpupool-allocator-config", types.MergePatchType,
		[]byte(`{"stringData":{"config.yaml":"namespaces: {ml: {idle: {action: report}}}"}}`), metav1.PatchOptions{})
	refused("patching the allocator's config", err, `cannot patch resource "secrets" in API group "" in the namespace "gpupool"`)
	_, err = member.CoreV1().Namespaces().Patch(ctx, "ml", types.MergePatchType, []byte(`{"metadata":{"annotations":{"gpupool.io/idle-exempt":"mine"}}}`), metav1.PatchOptions{})
	refused("annotating the namespace", err, `cannot patch resource "namespaces"`)

	// Exemptions: on a pod, in a Deployment's, a StatefulSet's, a Job's
	// and a CronJob's templates.
	_, err = member.CoreV1().Pods("ml").Create(ctx, pod("mine", exempt), metav1.CreateOptions{})
	refused("creating an exempt pod", err, byPolicy)
	_, err = member.AppsV1().Deployments("ml").Create(ctx, deployment("mine", exempt), metav1.CreateOptions{})
	refused("creating a Deployment whose pods are exempt", err, byPolicy)
	_, err = member.AppsV1().StatefulSets("ml").Create(ctx, &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "mine", Annotations: exempt},
		Spec: appsv1.StatefulSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "mine"}}, Template: deployment("mine", nil).Spec.Template}}, metav1.CreateOptions{})
	refused("creating an exempt StatefulSet", err, byPolicy)
	_, err = member.BatchV1().CronJobs("ml").Create(ctx, &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "mine"}, Spec: batchv1.CronJobSpec{Schedule: "@hourly",
		JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: template("mine", exempt)}}}}, metav1.CreateOptions{})
	refused("creating a CronJob whose Jobs' pods are exempt", err, byPolicy)
	notebook, err := member.CoreV1().Pods("ml").Create(ctx, pod("notebook", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the member's own pod: %v", err)
	}
	_, err = member.CoreV1().Pods("ml").Patch(ctx, notebook.Name, types.MergePatchType, []byte(`{"metadata":{"annotations":{"gpupool.io/idle-exempt":"mine"}}}`), metav1.PatchOptions{})
	refused("annotating a pod exempt", err, byPolicy)

	// The platform team may, and the pods stamped from its template are
	// admitted; the member edits the exempt Deployment, and may not
	// remove the exemption.
	if _, err := platform.CoreV1().Pods("ml").Patch(ctx, notebook.Name, types.MergePatchType, []byte(`{"metadata":{"annotations":{"gpupool.io/idle-exempt":"a demo"}}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("the platform team exempting a pod: %v", err)
	}
	if _, err := platform.AppsV1().Deployments("ml").Create(ctx, deployment("lab", exempt), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the platform team's exempt Deployment: %v", err)
	}
	waitFor(t, func() bool {
		pods, err := admin.CoreV1().Pods("ml").List(ctx, metav1.ListOptions{LabelSelector: "app=lab"})
		return err == nil && len(pods.Items) == 1 && pods.Items[0].Annotations[kube.AnnotationIdleExempt] == exempt[kube.AnnotationIdleExempt]
	})
	if _, err := member.AppsV1().Deployments("ml").Patch(ctx, "lab", types.StrategicMergePatchType,
		[]byte(`{"spec":{"template":{"spec":{"containers":[{"name":"main","image":"notebook:v2"}]}}}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("the member editing the exempt Deployment's image: %v", err)
	}
	_, err = member.AppsV1().Deployments("ml").Patch(ctx, "lab", types.JSONPatchType,
		[]byte(`[{"op":"remove","path":"/spec/template/metadata/annotations/gpupool.io~1idle-exempt"}]`), metav1.PatchOptions{})
	refused("removing the exemption", err, byPolicy)

	// What the policy suspended, the member resumes, with gpupool resume.
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "train", Annotations: map[string]string{kube.AnnotationIdleSuspended: "2026-11-29T14:05:00Z"}},
		Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: template("train", nil)}}
	if _, err := admin.BatchV1().Jobs("ml").Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, code := gpupool(t, []string{"KUBECONFIG=" + memberKubeconfig}, "resume", "job/train", "-n", "ml")
	if code != 0 || out != "Job ml/train resumed (suspended by the idle policy at 2026-11-29T14:05:00Z)\n" {
		t.Errorf("gpupool resume job/train as the member: exit %d, %q", code, out)
	}
	got, err := admin.BatchV1().Jobs("ml").Get(ctx, "train", metav1.GetOptions{})
	if err != nil || ptr.Deref(got.Spec.Suspend, true) || got.Annotations[kube.AnnotationIdleSuspended] != "" {
		t.Errorf("the Job after gpupool resume: %v, %v", got.Spec.Suspend, err)
	}
	out, code = gpupool(t, []string{"KUBECONFIG=" + memberKubeconfig}, "resume", "job/train")
	if want := "gpupool resume: Job ml/train was not suspended by the idle policy"; code != 1 || !strings.HasPrefix(out, want) {
		t.Errorf("gpupool resume again: exit %d, %q; want 1 and %q", code, out, want)
	}
}

// serviceAccountUser makes a ServiceAccount name in ns, bound there to the
// ClusterRoles roles, and returns a client with a token of it, as a
// namespace member's kubectl has, and a kubeconfig file of that token.
func serviceAccountUser(t *testing.T, ctx context.Context, cp *e2ekube.ControlPlane, ns, name string, roles ...string) (kubernetes.Interface, string) {
	t.Helper()
	c := cp.Client
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, role := range roles {
		binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name + "-" + role},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}}
		if _, err := c.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	tr, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(cp.Config)
	cfg.BearerToken = tr.Status.Token
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ca := cfg.CAData
	if len(ca) == 0 && cfg.CAFile != "" {
		if ca, err = os.ReadFile(cfg.CAFile); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: %q, certificate-authority-data: %q}}]
users: [{name: %s, user: {token: %q}}]
contexts: [{name: %s, context: {cluster: e2e, user: %s, namespace: %s}}]
current-context: %s
`, cfg.Host, base64.StdEncoding.EncodeToString(ca), name, tr.Status.Token, name, name, ns, name)
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	return client, path
}

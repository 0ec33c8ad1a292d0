package deploy_test

import (
	"cmp"
	"slices"
	"testing"

	"github.com/google/cel-go/cel"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpupool/gpupool/kube"
)

// pluginUser is the device plugin's ServiceAccount as kube-apiserver names
// it in a request.
const pluginUser = "system:serviceaccount:gpupool:gpupool-device-plugin"

// TestDevicePluginPolicy runs the ValidatingAdmissionPolicy that keeps the
// device plugin's token to its one write, as kube-apiserver evaluates it:
// its match condition, then its variables, then each validation, in CEL
// over the request's pods. (test/e2e has kube-apiserver check that it
// compiles.) The plugin of node-1 may add gpupool.io/allocated to a pod
// on node-1, and nothing else.
func TestDevicePluginPolicy(t *testing.T) {
	objs := build(t, "overlays/full")
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	find(t, objs, "ValidatingAdmissionPolicy", "gpupool-device-plugin", &policy)
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	find(t, objs, "ValidatingAdmissionPolicyBinding", "gpupool-device-plugin", &binding)
	if binding.Spec.PolicyName != policy.Name || len(binding.Spec.ValidationActions) != 1 || binding.Spec.ValidationActions[0] != admissionregistrationv1.Deny {
		t.Fatalf("binding %+v does not deny by policy %s", binding.Spec, policy.Name)
	}

	env, err := cel.NewEnv(cel.Variable("object", cel.DynType), cel.Variable("oldObject", cel.DynType),
		cel.Variable("request", cel.DynType), cel.Variable("variables", cel.MapType(cel.StringType, cel.DynType)))
	if err != nil {
		t.Fatal(err)
	}
	eval := func(expression string, vars map[string]any) any {
		t.Helper()
		ast, iss := env.Compile(expression)
		if iss.Err() != nil {
			t.Fatalf("%s: %v", expression, iss.Err())
		}
		prg, err := env.Program(ast)
		if err != nil {
			t.Fatal(err)
		}
		out, _, err := prg.Eval(vars)
		if err != nil {
			t.Fatalf("%s: %v", expression, err)
		}
		return out.Value()
	}
	// denied runs the policy on an update by user from node (none when
	// empty) of old into updated: the messages of the validations that fail,
	// and whether the policy applies at all.
	denied := func(user, node string, old, updated *corev1.Pod) (applies bool, messages []string) {
		request := map[string]any{"userInfo": map[string]any{"username": user}}
		if node != "" {
			request["userInfo"].(map[string]any)["extra"] = map[string]any{"authentication.kubernetes.io/node-name": []any{node}}
		}
		vars := map[string]any{"object": asCEL(t, updated), "oldObject": asCEL(t, old), "request": request}
		for _, c := range policy.Spec.MatchConditions {
			if eval(c.Expression, vars) != true {
				return false, nil
			}
		}
		variables := map[string]any{}
		vars["variables"] = variables
		for _, v := range policy.Spec.Variables {
			variables[v.Name] = eval(v.Expression, vars)
		}
		for _, v := range policy.Spec.Validations {
			if eval(v.Expression, vars) != true {
				messages = append(messages, v.Message+eval(cmp.Or(v.MessageExpression, "''"), vars).(string))
			}
		}
		return true, messages
	}

	pod := func(node string, change func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ml", Labels: map[string]string{"app": "train"},
				Annotations: map[string]string{kube.AnnotationLease: "lease-000001"}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Image: "train:v1"}}},
		}
		if change != nil {
			change(p)
		}
		return p
	}
	mark := func(p *corev1.Pod) { p.Annotations[kube.AnnotationAllocated] = "0123456789abcdef" }
	for _, tc := range []struct {
		name     string
		user     string
		node     string
		old      *corev1.Pod
		updated  *corev1.Pod
		applies  bool
		messages []string
	}{
		{"the plugin marks a pod of its node", pluginUser, "node-1", pod("node-1", nil), pod("node-1", mark), true, nil},
		{"another node's pod", pluginUser, "node-2", pod("node-1", nil), pod("node-1", mark), true,
			[]string{"the device plugin of node node-2 may change the pods of its own node only"}},
		{"a token that names no node", pluginUser, "", pod("node-1", nil), pod("node-1", mark), true,
			[]string{"the device plugin of node (none named in its token) may change the pods of its own node only"}},
		{"an image", pluginUser, "node-1", pod("node-1", nil), pod("node-1", func(p *corev1.Pod) { p.Spec.Containers[0].Image = "evil:v1" }), true,
			[]string{"the device plugin may change a pod's gpupool.io/allocated annotation only"}},
		{"a label", pluginUser, "node-1", pod("node-1", nil), pod("node-1", func(p *corev1.Pod) { p.Labels["app"] = "other" }), true,
			[]string{"the device plugin may change a pod's gpupool.io/allocated annotation only"}},
		{"a finalizer", pluginUser, "node-1", pod("node-1", nil), pod("node-1", func(p *corev1.Pod) { p.Finalizers = []string{"x"} }), true,
			[]string{"the device plugin may change a pod's gpupool.io/allocated annotation only"}},
		{"another annotation", pluginUser, "node-1", pod("node-1", nil), pod("node-1", func(p *corev1.Pod) { p.Annotations[kube.AnnotationLease] = "lease-000002" }), true,
			[]string{"the device plugin may add a pod's gpupool.io/allocated annotation only, once"}},
		{"a mark changed", pluginUser, "node-1", pod("node-1", mark), pod("node-1", func(p *corev1.Pod) { p.Annotations[kube.AnnotationAllocated] = "fedcba9876543210" }), true,
			[]string{"the device plugin may add a pod's gpupool.io/allocated annotation only, once"}},
		{"a mark removed", pluginUser, "node-1", pod("node-1", mark), pod("node-1", nil), true,
			[]string{"the device plugin may add a pod's gpupool.io/allocated annotation only, once"}},
		{"someone else", "system:serviceaccount:gpupool:gpupool-scheduler", "", pod("node-1", nil), pod("node-2", nil), false, nil},
	} {
		applies, messages := denied(tc.user, tc.node, tc.old, tc.updated)
		if applies != tc.applies || !slices.Equal(messages, tc.messages) {
			t.Errorf("%s: applies %v, denied %q; want %v, %q", tc.name, applies, messages, tc.applies, tc.messages)
		}
	}
}

// asCEL is a pod as CEL sees it: its JSON.
func asCEL(t *testing.T, pod *corev1.Pod) map[string]any {
	t.Helper()
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(pod)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

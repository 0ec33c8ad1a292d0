package deploy_test

import (
	"cmp"
	"slices"
	"testing"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/ext"
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
	denied := loadPolicy(t, "gpupool-device-plugin")

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
		applies, messages := denied(admissionRequest{user: tc.user, node: tc.node, old: tc.old, object: tc.updated})
		if applies != tc.applies || !slices.Equal(messages, tc.messages) {
			t.Errorf("%s: applies %v, denied %q; want %v, %q", tc.name, applies, messages, tc.applies, tc.messages)
		}
	}
}

// TestPodAnnotationsPolicy runs the ValidatingAdmissionPolicy that keeps
// the pool's record on a pod to the pool: no one else may create a pod
// with gpupool.io/lease, gpupool.io/gpus or gpupool.io/allocated, or add,
// change or remove one; everything else of a pod stays theirs.
func TestPodAnnotationsPolicy(t *testing.T) {
	denied := loadPolicy(t, "gpupool-pod-annotations")
	const (
		user       = "alice"
		replicaSet = "system:serviceaccount:kube-system:replicaset-controller"
		scheduler  = "system:serviceaccount:gpupool:gpupool-scheduler"
	)
	pod := func(annotations ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ml", Labels: map[string]string{"app": "train"},
			Annotations: map[string]string{kube.AnnotationRequest: `{"gpuAmount":1}`}}}
		for i := 0; i+1 < len(annotations); i += 2 {
			p.Annotations[annotations[i]] = annotations[i+1]
		}
		return p
	}
	bound := func(more ...string) *corev1.Pod {
		return pod(append([]string{kube.AnnotationLease, "lease-000001", kube.AnnotationGPUs, "GPU-1"}, more...)...)
	}
	relabelled := bound()
	relabelled.Labels["app"] = "other"
	const onCreate, onUpdate = ": create the pod without it", ": an update may not add, change or remove it"
	for _, tc := range []struct {
		name        string
		user        string
		old, object *corev1.Pod
		applies     bool
		messages    []string
	}{
		{"a user creates a pod", user, nil, pod(), true, nil},
		{"a user creates a pod with a lease", user, nil, pod(kube.AnnotationLease, "lease-000007"), true,
			[]string{"only gpupool sets gpupool.io/lease on a pod" + onCreate}},
		{"a controller creates one from a bound pod's copy", replicaSet, nil, bound(kube.AnnotationAllocated, "0123"), true,
			[]string{"only gpupool sets gpupool.io/lease, gpupool.io/gpus, gpupool.io/allocated on a pod" + onCreate}},
		{"a user relabels a bound pod", user, bound(), relabelled, true, nil},
		{"a user changes its lease", user, bound(), bound(kube.AnnotationLease, "lease-000009"), true,
			[]string{"only gpupool sets gpupool.io/lease on a pod" + onUpdate}},
		{"a user adds the device plugin's mark", user, bound(), bound(kube.AnnotationAllocated, "0123"), true,
			[]string{"only gpupool sets gpupool.io/allocated on a pod" + onUpdate}},
		{"a user removes the GPUs", user, bound(), pod(kube.AnnotationLease, "lease-000001"), true,
			[]string{"only gpupool sets gpupool.io/gpus on a pod" + onUpdate}},
		{"gpupool-scheduler writes a lease", scheduler, pod(), bound(), false, nil},
		// What admission decided: the webhook checks it on create, this
		// policy on update.
		{"a user changes the request", user, bound(), bound(kube.AnnotationRequest, `{"gpuAmount":8}`), true,
			[]string{`metadata.annotations[gpupool.io/request]: cannot change once the pod is admitted (was "{"gpuAmount":1}")`}},
		{"a user unmarks the pod", user, pod(kube.AnnotationStatus, kube.StatusInjected), pod(), true,
			[]string{`metadata.annotations[auto-management/status]: cannot change once the pod is admitted (was "injected")`}},
		{"a user adds a request and the mark", user, pod(), pod(kube.AnnotationStatus, kube.StatusInjected, kube.AnnotationRequest, `{"gpuAmount":1}`), true,
			[]string{`metadata.annotations[auto-management/status]: cannot change once the pod is admitted (was absent)`}},
		{"a user creates a pod marked with a request", user, nil, pod(kube.AnnotationStatus, kube.StatusInjected), true, nil},
		{"the device plugin marks a pod", pluginUser, bound(), bound(kube.AnnotationAllocated, "0123"), false, nil},
	} {
		applies, messages := denied(admissionRequest{user: tc.user, old: tc.old, object: tc.object})
		if applies != tc.applies || !slices.Equal(messages, tc.messages) {
			t.Errorf("%s: applies %v, denied %q; want %v, %q", tc.name, applies, messages, tc.applies, tc.messages)
		}
	}
}

// admissionRequest is what a policy sees of a request: who asks (and,
// for a pod's ServiceAccount token, the node it names), the pod, and on
// update the pod before it.
type admissionRequest struct {
	user, node  string
	old, object *corev1.Pod
}

// loadPolicy finds the ValidatingAdmissionPolicy name in the full overlay,
// checks that its binding denies, and returns the policy as kube-apiserver
// evaluates it: its match conditions, then its variables, then each
// validation, in CEL over the request (with the libraries kube-apiserver
// adds that it uses). It says whether the policy applies, and the
// messages of the validations that fail.
func loadPolicy(t *testing.T, name string) func(admissionRequest) (applies bool, messages []string) {
	t.Helper()
	objs := build(t, "overlays/full")
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	find(t, objs, "ValidatingAdmissionPolicy", name, &policy)
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	find(t, objs, "ValidatingAdmissionPolicyBinding", name, &binding)
	if binding.Spec.PolicyName != policy.Name || len(binding.Spec.ValidationActions) != 1 || binding.Spec.ValidationActions[0] != admissionregistrationv1.Deny {
		t.Fatalf("binding %+v does not deny by policy %s", binding.Spec, policy.Name)
	}

	env, err := cel.NewEnv(cel.Variable("object", cel.DynType), cel.Variable("oldObject", cel.DynType),
		cel.Variable("request", cel.DynType), cel.Variable("variables", cel.MapType(cel.StringType, cel.DynType)), ext.Strings())
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
	return func(r admissionRequest) (bool, []string) {
		t.Helper()
		operation := "UPDATE"
		if r.old == nil {
			operation = "CREATE"
		}
		request := map[string]any{"operation": operation, "userInfo": map[string]any{"username": r.user}}
		if r.node != "" {
			request["userInfo"].(map[string]any)["extra"] = map[string]any{"authentication.kubernetes.io/node-name": []any{r.node}}
		}
		vars := map[string]any{"object": asCEL(t, r.object), "oldObject": asCEL(t, r.old), "request": request}
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
		var messages []string
		for _, v := range policy.Spec.Validations {
			if eval(v.Expression, vars) != true {
				messages = append(messages, v.Message+eval(cmp.Or(v.MessageExpression, "''"), vars).(string))
			}
		}
		return true, messages
	}
}

// asCEL is a pod as CEL sees it: its JSON; null for none.
func asCEL(t *testing.T, pod *corev1.Pod) any {
	t.Helper()
	if pod == nil {
		return nil
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(pod)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

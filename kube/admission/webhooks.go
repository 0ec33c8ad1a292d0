package admission

import (
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpupool/gpupool/kube"
)

// MutatingWebhookName is the name kube-apiserver gives when it reports a
// denial ("admission webhook "mutate.pods.gpupool.io" denied the request:
// ...").
const MutatingWebhookName = "mutate.pods.gpupool.io"

// MatchConditions keep the webhook to the pods it owns: those whose
// containers or init containers name a bitfusion.io resource, and those
// that carry gpupool's request annotation (Mutate refuses it on a pod that
// asks for nothing, which could otherwise claim a lease). Any other
// pod is admitted without a call, so that an outage of the webhook never
// blocks it.
var MatchConditions = []admissionregistrationv1.MatchCondition{{
	Name: "asks-for-bitfusion-resources",
	Expression: fmt.Sprintf(`%s || (has(object.spec.initContainers) && %s) || (has(object.metadata.annotations) && %q in object.metadata.annotations)`,
		asksIn("object.spec.containers"), asksIn("object.spec.initContainers"), kube.AnnotationRequest),
}}

// asksIn is a CEL expression: whether a container of the list names a
// bitfusion.io resource.
func asksIn(containers string) string {
	in := func(list string) string {
		return fmt.Sprintf(`(has(c.resources.%[1]s) && c.resources.%[1]s.exists(n, n.startsWith(%[2]q)))`, list, kube.ResourcePrefix)
	}
	return fmt.Sprintf(`%s.exists(c, has(c.resources) && (%s || %s))`, containers, in("limits"), in("requests"))
}

// Webhook returns the configuration, called name, that registers the
// webhook with kube-apiserver for created pods; clientConfig says where
// kube-apiserver reaches a path (/mutate): a Service, or a URL.
//
// Its failurePolicy is Fail: a pod that asks for bitfusion.io resources
// and is not normalised can never run (no node has bitfusion.io/gpu-amount,
// and no quota counts it), so admitting it unhandled helps nobody, while
// MatchConditions keep every other pod away from the webhook. Its
// reinvocationPolicy is IfNeeded: when a later webhook changes the pod,
// kube-apiserver calls this one again, and Mutate checks the changed pod
// against its recorded request, so the pod stored is one the pool leases
// for. No validating webhook follows: the check of a pod created marked is
// Mutate's, the check of an update is a ValidatingAdmissionPolicy's, and
// each call a pod waits for costs kube-apiserver about 1 ms of CPU.
func Webhook(name string, clientConfig func(path string) admissionregistrationv1.WebhookClientConfig) *admissionregistrationv1.MutatingWebhookConfiguration {
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: MutatingWebhookName, ClientConfig: clientConfig("/mutate"),
			Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope)}}},
			MatchConditions: MatchConditions, FailurePolicy: ptr.To(admissionregistrationv1.Fail), SideEffects: ptr.To(admissionregistrationv1.SideEffectClassNone),
			ReinvocationPolicy: ptr.To(admissionregistrationv1.IfNeededReinvocationPolicy), AdmissionReviewVersions: []string{reviewVersion.Version},
		}},
	}
}

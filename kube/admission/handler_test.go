package admission

import (
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpupool/gpupool/kube"
)

func serve(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(NewHandler(config(kube.UnitPercent)))
	t.Cleanup(srv.Close)
	return srv.URL
}

// review is an AdmissionReview v1 of pod (and old, on update), as
// kube-apiserver sends it.
func review(t *testing.T, op admissionv1.Operation, pod, old *corev1.Pod) []byte {
	t.Helper()
	raw := func(p *corev1.Pod) runtime.RawExtension {
		if p == nil {
			return runtime.RawExtension{}
		}
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		return runtime.RawExtension{Raw: b}
	}
	b, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "review-1", Operation: op, Namespace: "ml",
			Kind:     metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Object:   raw(pod), OldObject: raw(old)},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func post(t *testing.T, url, contentType string, body []byte) (int, string) {
	t.Helper()
	resp, err := http.Post(url, contentType, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// answered posts a review and returns the response in the answer.
func answered(t *testing.T, url string, body []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	code, text := post(t, url, "application/json", body)
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal([]byte(text), &out); code != http.StatusOK || err != nil || out.Response == nil {
		t.Fatalf("answer %d %s (%v)", code, text, err)
	}
	if out.APIVersion != "admission.k8s.io/v1" || out.Kind != "AdmissionReview" || out.Response.UID != "review-1" {
		t.Errorf("answer %s %s for %q, want an admission.k8s.io/v1 AdmissionReview for review-1", out.APIVersion, out.Kind, out.Response.UID)
	}
	return out.Response
}

func TestHandlerMutates(t *testing.T) {
	url := serve(t)
	pod := podOf(asking("bitfusion.io/gpu-amount=1", "bitfusion.io/gpu-percent=50"))
	resp := answered(t, url+"/mutate", review(t, admissionv1.Create, pod, nil))
	if !resp.Allowed || resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("response %+v: want allowed with a JSON patch", resp)
	}
	want, _ := config(kube.UnitPercent).Mutate(pod)
	var got Patch
	if err := json.Unmarshal(resp.Patch, &got); err != nil || len(got) != len(want) {
		t.Fatalf("patch %s (%v), want %d operations", resp.Patch, err, len(want))
	}
	mutated := apply(t, pod, got)
	if q := mutated.Spec.Containers[0].Resources.Requests[kube.ResourceGPU]; q.Value() != 50 {
		t.Errorf("the patched pod asks for bitfusion.io/gpu %s, want 50", &q)
	}

	// An update is the policy's, in kube-apiserver: nothing to patch.
	if resp := answered(t, url+"/mutate", review(t, admissionv1.Update, mutated, mutated)); !resp.Allowed || resp.Patch != nil {
		t.Errorf("update: response %+v, want allowed without a patch", resp)
	}
}

func TestHandlerDenies(t *testing.T) {
	url := serve(t)
	for _, tc := range []struct {
		path      string
		op        admissionv1.Operation
		pod, old  *corev1.Pod
		wantCause string
	}{
		{"/mutate", admissionv1.Create, podOf(asking("bitfusion.io/gpu-percent=150")), nil, "spec.containers[0].resources.limits[bitfusion.io/gpu-amount]"},
		{"/mutate", admissionv1.Create, annotated(podOf(asking("bitfusion.io/gpu-amount=1")), kube.AnnotationStatus, kube.StatusInjected), nil,
			"spec.containers[0].resources.limits[bitfusion.io/gpu-amount]"},
		{"/mutate", admissionv1.Create, annotated(podOf(), kube.AnnotationRequest, `{"gpuAmount":8}`), nil, "metadata.annotations[gpupool.io/request]"},
	} {
		resp := answered(t, url+tc.path, review(t, tc.op, tc.pod, tc.old))
		if resp.Allowed || resp.Patch != nil || resp.Result == nil || resp.Result.Code != http.StatusUnprocessableEntity ||
			resp.Result.Reason != metav1.StatusReasonInvalid || resp.Result.Details == nil || len(resp.Result.Details.Causes) != 1 ||
			resp.Result.Details.Causes[0].Field != tc.wantCause || !strings.HasPrefix(resp.Result.Message, tc.wantCause+": ") {
			t.Errorf("%s %s: response %+v, want denied as invalid for %s", tc.op, tc.path, resp, tc.wantCause)
		}
	}
}

func TestHandlerRefusesWhatIsNoPodReview(t *testing.T) {
	url := serve(t)
	pod := podOf(asking("bitfusion.io/gpu-amount=1"))
	good := review(t, admissionv1.Create, pod, nil)
	for _, tc := range []struct {
		name        string
		contentType string
		body        []byte
		code        int
		message     string
	}{
		{"a form", "application/x-www-form-urlencoded", good, http.StatusBadRequest, `Content-Type "application/x-www-form-urlencoded": an AdmissionReview is application/json`},
		{"not JSON", "application/json", []byte("{"), http.StatusBadRequest, "reading the AdmissionReview: unexpected end of JSON input"},
		{"too large", "application/json", append([]byte(`{"kind":"`), bytes.Repeat([]byte("x"), maxReviewBytes)...), http.StatusRequestEntityTooLarge,
			"an AdmissionReview of 7340041 bytes: more than 7340032"},
		{"annotations not strings", "application/json", bytes.Replace(good, []byte(`"metadata":{`), []byte(`"metadata":{"annotations":{"a":1},`), 1),
			http.StatusBadRequest, "reading the AdmissionReview: metadata.annotations: a value that is not a string"},
		{"v1beta1", "application/json", bytes.Replace(good, []byte("admission.k8s.io/v1"), []byte("admission.k8s.io/v1beta1"), 1), http.StatusBadRequest,
			`want an admission.k8s.io/v1 AdmissionReview with a request, got "admission.k8s.io/v1beta1" "AdmissionReview"`},
		{"no request", "application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), http.StatusBadRequest,
			`want an admission.k8s.io/v1 AdmissionReview with a request, got "admission.k8s.io/v1" "AdmissionReview"`},
	} {
		code, text := post(t, url+"/mutate", tc.contentType, tc.body)
		if code != tc.code || strings.TrimSpace(text) != tc.message {
			t.Errorf("%s: %d %s, want %d %s", tc.name, code, text, tc.code, tc.message)
		}
	}
	// A body of no declared length is cut at the bound as it is read.
	chunked := io.MultiReader(strings.NewReader(`{"kind":"`), bytes.NewReader(bytes.Repeat([]byte("x"), maxReviewBytes)))
	cut, err := http.Post(url+"/mutate", "application/json", chunked)
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(cut.Body)
	_ = cut.Body.Close()
	if cut.StatusCode != http.StatusRequestEntityTooLarge || strings.TrimSpace(string(text)) != "reading the AdmissionReview: http: request body too large" {
		t.Errorf("too large, chunked: %d %s", cut.StatusCode, text)
	}

	// A review of another resource, a pod's status, is refused in the answer, where
	// kube-apiserver shows it: the webhook's rules are wrong.
	var r admissionv1.AdmissionReview
	if err := json.Unmarshal(good, &r); err != nil {
		t.Fatal(err)
	}
	r.Request.Resource.Resource, r.Request.SubResource = "pods", "status"
	b, _ := json.Marshal(r)
	resp := answered(t, url+"/mutate", b)
	if resp.Allowed || resp.Result.Code != http.StatusBadRequest ||
		resp.Result.Message != "gpupool's webhook admits pods, not pods/status: check the webhook configuration's rules" {
		t.Errorf("a pod's status's review: %+v", resp.Result)
	}
}

func TestHandlerHealthz(t *testing.T) {
	url := serve(t)
	resp, err := http.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "ok\n" {
		t.Errorf("/healthz: %d %q", resp.StatusCode, b)
	}
	if resp, err := http.Get(url + "/mutate"); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /mutate: %v %v, want 405", resp, err)
	}
}

// TestHandlerReadsWhatItDecidesOn: a review carrying megabytes the webhook
// does not read (an annotation of another tool's, a container's env) is
// decided as the same pod without them, and the patch names only what the
// webhook sets, never those megabytes back.
func TestHandlerReadsWhatItDecidesOn(t *testing.T) {
	url := serve(t)
	bulk := strings.Repeat("x", 3<<20)
	pod := annotated(podOf(asking("bitfusion.io/gpu-amount=1", "bitfusion.io/gpu-percent=50")), "other.tool/state", bulk, kube.AnnotationModels, "A100")
	pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "BULK", Value: bulk}}
	resp := answered(t, url+"/mutate", review(t, admissionv1.Create, pod, nil))
	if !resp.Allowed || len(resp.Patch) > 1024 {
		t.Fatalf("allowed %v, a patch of %d bytes: want allowed, with a patch of what the webhook sets", resp.Allowed, len(resp.Patch))
	}
	var got Patch
	if err := json.Unmarshal(resp.Patch, &got); err != nil {
		t.Fatal(err)
	}
	mutated := apply(t, pod, got)
	if mutated.Annotations["other.tool/state"] != bulk || mutated.Annotations[kube.AnnotationStatus] != kube.StatusInjected ||
		mutated.Spec.Containers[0].Env[0].Value != bulk {
		t.Error("the patched pod lost what it carried, or was not marked")
	}
	if r, _, err := kube.RequestOf(mutated.Annotations); err != nil || len(r.Models) != 1 || r.Models[0] != "A100" {
		t.Errorf("recorded request %+v (%v): want the models annotation read", r, err)
	}
}

// TestReadAnnotations: the annotations the webhook reads are kept, JSON
// escapes and all; the others, of any size, are skipped.
func TestReadAnnotations(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want readAnnotations
	}{
		{`null`, nil},
		{`{}`, readAnnotations{}},
		{` { "gpupool.io\/request" : "{\"gpuAmount\":1}" , "a": "b\"}", "auto-management/bitfusion":"all"}`,
			readAnnotations{"gpupool.io/request": `{"gpuAmount":1}`, "auto-management/bitfusion": "all"}},
		{`{"` + strings.Repeat("k", 400) + `":"v","bitfusion-client/os":"ubuntu20"}`, readAnnotations{"bitfusion-client/os": "ubuntu20"}},
	} {
		var got readAnnotations
		if err := json.Unmarshal([]byte(tc.in), &got); err != nil || !maps.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
			t.Errorf("%.60s: %v (%v), want %v", tc.in, got, err, tc.want)
		}
	}
	var got readAnnotations
	if err := json.Unmarshal([]byte(`["gpupool.io/request"]`), &got); err == nil {
		t.Error("an array of annotations: no error")
	}
}

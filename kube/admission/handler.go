package admission

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"

	"golang.org/x/sync/semaphore"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// maxReviewBytes bounds an AdmissionReview's body. An update carries the
// pod twice (object and oldObject), each at most etcd's 1.5 MiB request
// limit, in a review around them: controller-runtime bounds it the same.
const maxReviewBytes = 7 << 20

// maxBytesInFlight bounds the review bodies held at once: past it a review
// waits for room (kube-apiserver's timeout bounds the wait), so that a
// burst of the largest reviews cannot take the webhook past its memory
// limit. A review costs its body and what the webhook reads of it.
const maxBytesInFlight = 4 * maxReviewBytes

// reviewVersion is the AdmissionReview version the webhook speaks: the
// configurations list it alone in admissionReviewVersions.
var reviewVersion = admissionv1.SchemeGroupVersion.WithKind("AdmissionReview")

// NewHandler serves c to kube-apiserver: POST /mutate takes an
// AdmissionReview v1 of a created pod and answers one, with a JSON patch
// or a refusal; GET /healthz answers "ok".
func NewHandler(c Config) http.Handler {
	room := semaphore.NewWeighted(maxBytesInFlight)
	mux := http.NewServeMux()
	mux.Handle("POST /mutate", reviewer(room, func(op admissionv1.Operation, pod *corev1.Pod) (Patch, []string, field.ErrorList) {
		// Only a new pod's resources can change: an update is the
		// gpupool-pod-annotations policy's, in kube-apiserver itself.
		if op != admissionv1.Create {
			return nil, nil, nil
		}
		patch, errs := c.Mutate(pod)
		if len(errs) > 0 {
			return nil, nil, errs
		}
		return patch, c.Warnings(pod), nil
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	return mux
}

// decision is what the webhook decides on a pod: a patch and warnings
// for its author, or why the pod is refused.
type decision func(op admissionv1.Operation, pod *corev1.Pod) (Patch, []string, field.ErrorList)

// reviewer reads an AdmissionReview, has decide decide, and answers the
// review. A body that is no AdmissionReview v1 is answered 400, or 413 when
// too large; a review of anything but a pod is refused in the answer, so
// that kube-apiserver shows the misconfiguration.
func reviewer(room *semaphore.Weighted, decide decision) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
			http.Error(w, fmt.Sprintf("Content-Type %q: an AdmissionReview is application/json", r.Header.Get("Content-Type")), http.StatusBadRequest)
			return
		}
		size := r.ContentLength
		switch {
		case size > maxReviewBytes:
			http.Error(w, fmt.Sprintf("an AdmissionReview of %d bytes: more than %d", size, maxReviewBytes), http.StatusRequestEntityTooLarge)
			return
		case size < 0: // chunked: room for the largest
			size = maxReviewBytes
		}
		if err := room.Acquire(r.Context(), size); err != nil {
			http.Error(w, "waiting for room to read the AdmissionReview: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer room.Release(size)
		body, err := readBody(w, r)
		if err != nil {
			code := http.StatusBadRequest
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				code = http.StatusRequestEntityTooLarge
			}
			http.Error(w, "reading the AdmissionReview: "+err.Error(), code)
			return
		}
		var review reviewed
		if err := json.Unmarshal(body, &review); err != nil {
			http.Error(w, "reading the AdmissionReview: "+err.Error(), http.StatusBadRequest)
			return
		}
		if review.APIVersion != reviewVersion.GroupVersion().String() || review.Kind != reviewVersion.Kind || review.Request == nil {
			http.Error(w, fmt.Sprintf("want an %s %s with a request, got %q %q", reviewVersion.GroupVersion(), reviewVersion.Kind, review.APIVersion, review.Kind),
				http.StatusBadRequest)
			return
		}
		resp := answer(review.Request, decide)
		resp.UID = review.Request.UID
		out := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: reviewVersion.GroupVersion().String(), Kind: reviewVersion.Kind}, Response: resp}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})
}

// readBody reads a review's body into a buffer of its declared size, so
// that reading costs the body once.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body := http.MaxBytesReader(w, r.Body, maxReviewBytes)
	if r.ContentLength < 0 {
		return io.ReadAll(body)
	}
	buf := make([]byte, r.ContentLength)
	if _, err := io.ReadFull(body, buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// answer decides req.
func answer(req *reviewRequest, decide decision) *admissionv1.AdmissionResponse {
	pods := corev1.SchemeGroupVersion.WithResource("pods")
	if req.Resource.Group != pods.Group || req.Resource.Resource != pods.Resource || req.SubResource != "" {
		resource := schema.GroupResource{Group: req.Resource.Group, Resource: req.Resource.Resource}.String()
		if req.SubResource != "" {
			resource += "/" + req.SubResource
		}
		return failure(http.StatusBadRequest, "gpupool's webhook admits pods, not "+resource+": check the webhook configuration's rules")
	}
	if req.Object == nil {
		return failure(http.StatusBadRequest, "the review has no pod in object")
	}
	pod := req.Object.pod()
	patch, warnings, errs := decide(req.Operation, pod)
	if len(errs) > 0 {
		st := apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Pod").GroupKind(), pod.Name, errs).ErrStatus
		// kube-apiserver says which webhook denied what; the causes say why.
		st.Message = errs.ToAggregate().Error()
		return &admissionv1.AdmissionResponse{Result: &st}
	}
	resp := &admissionv1.AdmissionResponse{Allowed: true, Warnings: warnings}
	if len(patch) > 0 {
		b, err := json.Marshal(patch)
		if err != nil {
			panic(err) // strings, maps and quantities: cannot fail
		}
		jsonPatch := admissionv1.PatchTypeJSONPatch
		resp.Patch, resp.PatchType = b, &jsonPatch
	}
	return resp
}

func failure(code int32, message string) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{Result: &metav1.Status{Status: metav1.StatusFailure, Code: code, Message: message}}
}

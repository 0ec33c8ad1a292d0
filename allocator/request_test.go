package allocator

import (
	"errors"
	"strings"
	"testing"
)

// TestOwnerIsAKubernetesPod: a lease's owner is a pod as Kubernetes names
// it; what a probe sent as owner.pod reaches the admin's console and CSV.
func TestOwnerIsAKubernetesPod(t *testing.T) {
	valid := Request{Namespace: "ml", GPUs: 1}
	for _, o := range []Owner{{}, {Pod: "tf-training-5d8f9-xk2lp", UID: "7c682f66-8b92-d30a-5893-1f2ad346d947"}, {Pod: "worker-0.tf-job"}, {Pod: "load-1", UID: "uid-load-1"}} {
		r := valid
		r.Owner = o
		if err := r.Validate(); err != nil {
			t.Errorf("owner %+v: %v", o, err)
		}
	}
	for _, tc := range []struct {
		owner Owner
		field string
	}{
		{Owner{Pod: `=HYPERLINK("http://x","y")`}, "owner.pod"},
		{Owner{Pod: "\t=1+1"}, "owner.pod"},
		{Owner{Pod: "@SUM(A1)"}, "owner.pod"},
		{Owner{Pod: "Pod"}, "owner.pod"},
		{Owner{Pod: "a\nb"}, "owner.pod"},
		{Owner{Pod: "<b>p</b>"}, "owner.pod"},
		{Owner{Pod: strings.Repeat("p", 254)}, "owner.pod"},
		{Owner{Pod: "p", UID: "=1+1"}, "owner.uid"},
		{Owner{Pod: "p", UID: "uid with space"}, "owner.uid"},
		{Owner{Pod: "p", UID: strings.Repeat("u", 254)}, "owner.uid"},
	} {
		r := valid
		r.Owner = tc.owner
		err := r.Validate()
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("owner %+v: %v; want a refusal of %s", tc.owner, err, tc.field)
		}
		if err != nil && strings.ContainsAny(err.Error(), "\n\t") {
			t.Errorf("owner %+v: the refusal carries the raw bytes: %q", tc.owner, err)
		}
	}
}

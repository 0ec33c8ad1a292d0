package service

import (
	"reflect"
	"testing"

	"github.com/gpupool/gpupool/allocator/api"
)

// TestCheckKeys: a key given twice, at any depth, or a field's name in
// another case is refused, naming the key; what encoding/json reads as
// written passes.
func TestCheckKeys(t *testing.T) {
	acquire := reflect.TypeOf(&api.AcquireRequest{})
	for _, tc := range []struct {
		body, err string
	}{
		{`{"namespace":"ml","gpuAmount":1,"owner":{"pod":"p","labels":{"app":"x"}},"servers":["a","b"]}`, ""},
		{`{"namespace":"ml","gpuAmount":1,"gpuAmount":8}`, `key "gpuAmount" given twice`},
		{`{"namespace":"ml","owner":{"pod":"p","pod":"q"}}`, `key "owner.pod" given twice`},
		{`{"namespace":"ml","owner":{"labels":{"app":"x","app":"y"}}}`, `key "owner.labels.app" given twice`},
		{`{"namespace":"ml","GPUAmount":8}`, `key "GPUAmount": field names are case-sensitive; did you mean "gpuAmount"?`},
		{`{"namespace":"ml","owner":{"Pod":"p"}}`, `key "owner.Pod": field names are case-sensitive; did you mean "pod"?`},
	} {
		err := checkKeys([]byte(tc.body), acquire)
		if got := errorText(err); got != tc.err {
			t.Errorf("%s: %q, want %q", tc.body, got, tc.err)
		}
	}
}

func errorText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

package extender

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// FuzzNodeNames: whatever JSON kube-scheduler sends as NodeNames, the
// filter reads the names encoding/json reads, or refuses what is not an
// array of strings, as encoding/json does, or holds a name that is no
// node's, as kube-apiserver's validation says.
func FuzzNodeNames(f *testing.F) {
	for _, seed := range []string{
		`null`, `[]`, `[ ]`, `["gpu-0"]`, ` [ "gpu-0" , "gpu-1" ] `, `["gpu-\u0030", "a\"b"]`, `["", ""]`,
		`[1]`, `["a", 1]`, `["a" "b"]`, `{}`, `"gpu-0"`, `[["a"]]`, `["é"]`, `["GPU-0"]`, `["a..b"]`, `["-a"]`, `["a.b-c.d"]`,
	} {
		f.Add(seed)
	}
	known := &nameTable{}
	f.Fuzz(func(t *testing.T, data string) {
		if !json.Valid([]byte(data)) {
			return // json.Unmarshal refuses the call before the names are read
		}
		var want []string
		wantErr := json.Unmarshal([]byte(data), &want)
		for _, name := range want {
			if errs := validation.IsDNS1123Subdomain(name); wantErr == nil && len(errs) > 0 {
				wantErr = errors.New(errs[0])
			}
		}
		var args filterArgs
		args.NodeNames.known = known
		err := json.Unmarshal([]byte(`{"NodeNames":`+data+`}`), &args)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("%s: error %v, encoding/json's %v", data, err, wantErr)
		}
		if err == nil && (!slices.Equal(args.NodeNames.names, want) || args.NodeNames.given != (want != nil)) {
			t.Fatalf("%s: read %q (given %v), encoding/json %q", data, args.NodeNames.names, args.NodeNames.given, want)
		}
	})
}

// TestNodeNamesSeenAllocateNothing: the names of the next call, the same
// nodes, are read into the slice of the last with the strings of the
// last.
func TestNodeNamesSeenAllocateNothing(t *testing.T) {
	names := make([]string, 1213)
	for i := range names {
		names[i] = fmt.Sprintf("openb-node-%04d", i)
	}
	data, err := json.Marshal(names)
	if err != nil {
		t.Fatal(err)
	}
	n := nodeNames{known: &nameTable{}}
	if err := n.UnmarshalJSON(data); err != nil || !slices.Equal(n.names, names) {
		t.Fatalf("read %d names (%v), want %d", len(n.names), err, len(names))
	}
	if allocs := testing.AllocsPerRun(10, func() { _ = n.UnmarshalJSON(data) }); allocs != 0 {
		t.Errorf("reading names seen before allocates %v times", allocs)
	}
}

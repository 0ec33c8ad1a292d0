package jsonscan

import "testing"

// TestSkip: each kind of value is read whole, nested and escaped strings
// included, and the scan stops where the next value starts.
func TestSkip(t *testing.T) {
	for _, tc := range []struct{ in, rest string }{
		{`"a\"]}b", 1`, `, 1`},
		{`{"a":[1,{"b":"}"}],"c":null} ,2`, ` ,2`},
		{`[[],[{}],"]"]]`, `]`},
		{`-12.5e3,`, `,`},
		{`true}`, `}`},
	} {
		s := New([]byte(tc.in))
		s.Skip()
		if got := tc.in[s.i:]; got != tc.rest {
			t.Errorf("Skip(%s) left %q, want %q", tc.in, got, tc.rest)
		}
	}
}

func TestUnquote(t *testing.T) {
	for raw, want := range map[string]string{`"plain"`: "plain", `"a\/b\u00e9\n"`: "a/b\u00e9\n", `""`: ""} {
		if got, err := Unquote([]byte(raw)); err != nil || got != want {
			t.Errorf("Unquote(%s) = %q, %v; want %q", raw, got, err, want)
		}
	}
}

// TestObject: every member is seen with its key unquoted and its value
// read by the callback, nested objects and spaces included; what is no
// object is said so.
func TestObject(t *testing.T) {
	s := New([]byte(` { "a" : [1, {"x": "}"}] , "b\u0063":{"d":null},"e":"f" } tail`))
	got := map[string]string{}
	ok, err := s.Object(func(key string) error {
		got[key] = string(s.Value())
		return nil
	})
	want := map[string]string{"a": `[1, {"x": "}"}]`, "bc": `{"d":null}`, "e": `"f"`}
	if !ok || err != nil || len(got) != len(want) {
		t.Fatalf("Object: %v %v %v", ok, err, got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("member %q read %q, want %q", k, got[k], v)
		}
	}
	if rest := string(s.b[s.i:]); rest != " tail" {
		t.Errorf("Object left %q", rest)
	}
	if ok, _ := New([]byte(`[1]`)).Object(func(string) error { return nil }); ok {
		t.Error("a list read as an object")
	}
}

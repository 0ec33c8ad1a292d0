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

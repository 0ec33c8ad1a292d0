// Package fielderr is the error of one bad field of an input: which field,
// the value given and the limit it broke. The allocator's requests and
// package inventory's link names both report one (the allocator calls it
// FieldError), so it lives below both; a caller tells a bad input from a
// failure with errors.As.
package fielderr

// Error rejects one field: it names the field, the value that was given
// and the limit it broke, as in "gpu-percent 120 out of range 1..100".
type Error struct {
	Field string
	Value string
	Limit string
}

func (e *Error) Error() string {
	v := e.Value
	if v == "" {
		v = `""`
	}
	return e.Field + " " + v + " " + e.Limit
}

// Shorten is a value as an error quotes it: its first 40 bytes and "...",
// so that a long input does not drown the limit it broke.
func Shorten(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

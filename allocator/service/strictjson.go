package service

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"

	"github.com/gpupool/gpupool/internal/jsonscan"
)

// decodeStrict decodes one JSON value, body, into v: unknown fields,
// trailing data and what checkKeys refuses are errors.
func decodeStrict(body []byte, v any) error {
	if u, ok := v.(json.Unmarshaler); ok && json.Valid(body) {
		// A type that decodes itself (an acquisition, with thousands of
		// server names) is handed the body at once: through a decoder,
		// encoding/json would scan it once more to find where it ends.
		if err := u.UnmarshalJSON(body); err != nil {
			return err
		}
		return checkKeys(body, reflect.TypeOf(v))
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if extra := dec.Decode(&json.RawMessage{}); !errors.Is(extra, io.EOF) {
		return errors.New("more than one JSON value (or trailing data) in the body")
	}
	return checkKeys(body, reflect.TypeOf(v))
}

// checkKeys refuses what encoding/json lets through into v's type: a key
// given twice in one object (the last would win, unseen by whoever checks
// the first) and a field's name in another case ("GPUAmount" for
// "gpuAmount", which encoding/json matches). Unknown fields are the
// decoder's to refuse. data is one JSON value.
func checkKeys(data []byte, t reflect.Type) error {
	return walkKeys(jsonscan.New(data), t, "")
}

// walkKeys reads one value, whose type is t (nil: unknown) and whose path
// is path; a scalar, or a list of them, costs a scan and no allocation.
func walkKeys(s *jsonscan.Scanner, t reflect.Type, path string) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	s.Space()
	switch {
	case s.Byte('{'):
		var seen []string // objects here have a few keys
		for s.Space(); !s.Byte('}'); s.Space() {
			s.Byte(',')
			s.Space()
			raw, _ := s.Str()
			key, err := jsonscan.Unquote(raw)
			if err != nil {
				return err
			}
			at := strings.TrimPrefix(path+"."+key, ".")
			if slices.Contains(seen, key) {
				return fmt.Errorf("key %q given twice", at)
			}
			seen = append(seen, key)
			field, err := fieldOf(t, key, at)
			if err != nil {
				return err
			}
			s.Space()
			s.Byte(':')
			if err := walkKeys(s, field, at); err != nil {
				return err
			}
		}
	case s.Byte('['):
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; ; i++ {
			s.Space()
			if s.Byte(']') {
				break
			}
			s.Byte(',')
			s.Space()
			if c := s.Peek(); c != '{' && c != '[' {
				s.Skip()
				continue
			}
			if err := walkKeys(s, elem, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	default:
		s.Skip()
	}
	return nil
}

// fieldOf is the type of t's member key: a struct's field by its exact
// JSON name, a map's element; nil when t says nothing of it. A struct
// field named key in another case is refused.
func fieldOf(t reflect.Type, key, at string) (reflect.Type, error) {
	switch {
	case t == nil:
		return nil, nil
	case t.Kind() == reflect.Map:
		return t.Elem(), nil
	case t.Kind() != reflect.Struct:
		return nil, nil
	}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" {
			name = f.Name
		}
		switch {
		case name == key:
			return f.Type, nil
		case strings.EqualFold(name, key):
			return nil, fmt.Errorf("key %q: field names are case-sensitive; did you mean %q?", at, name)
		}
	}
	return nil, nil
}

package service

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// checkKeys refuses what encoding/json lets through into v's type: a key
// given twice in one object (the last would win, unseen by whoever checks
// the first) and a field's name in another case ("GPUAmount" for
// "gpuAmount", which encoding/json matches). Unknown fields are the
// decoder's to refuse. data is one JSON value.
func checkKeys(data []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return walkKeys(dec, t, "")
}

func walkKeys(dec *json.Decoder, t reflect.Type, path string) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return err
			}
			key := k.(string)
			at := strings.TrimPrefix(path+"."+key, ".")
			if seen[key] {
				return fmt.Errorf("key %q given twice", at)
			}
			seen[key] = true
			field, err := fieldOf(t, key, at)
			if err != nil {
				return err
			}
			if err := walkKeys(dec, field, at); err != nil {
				return err
			}
		}
		_, err = dec.Token()
		return err
	case json.Delim('['):
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if err := walkKeys(dec, elem, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		_, err = dec.Token()
		return err
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

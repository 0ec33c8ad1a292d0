// Package jsonscan walks JSON that encoding/json has already checked,
// without decoding it: what a caller does not read costs no allocation,
// however large (a pod's other annotations, a list of 100,000 server
// names).
package jsonscan

import (
	"bytes"
	"encoding/json"
	"strings"
)

// Scanner walks valid JSON: each method reads at the current position and
// says whether what it expected was there.
type Scanner struct {
	b []byte
	i int
}

// New scans b.
func New(b []byte) *Scanner { return &Scanner{b: b} }

// Space skips white space.
func (s *Scanner) Space() {
	for s.i < len(s.b) && strings.IndexByte(" \t\r\n", s.b[s.i]) >= 0 {
		s.i++
	}
}

// Peek is the next byte, 0 at the end.
func (s *Scanner) Peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// Byte reads c if it comes next.
func (s *Scanner) Byte(c byte) bool {
	if s.Peek() == c && s.i < len(s.b) {
		s.i++
		return true
	}
	return false
}

// Literal reads l if it comes next.
func (s *Scanner) Literal(l string) bool {
	if strings.HasPrefix(string(s.b[s.i:min(len(s.b), s.i+len(l))]), l) {
		s.i += len(l)
		return true
	}
	return false
}

// Str reads a string and returns it as written, quotes and escapes
// included, if one comes next.
func (s *Scanner) Str() ([]byte, bool) {
	start := s.i
	if !s.Byte('"') {
		return nil, false
	}
	for {
		end := bytes.IndexByte(s.b[s.i:], '"')
		if end < 0 {
			return nil, false
		}
		escape := bytes.IndexByte(s.b[s.i:s.i+end], '\\')
		if escape < 0 {
			s.i += end + 1
			return s.b[start:s.i], true
		}
		s.i += escape + 2 // the escaped byte may be a quote
	}
}

// Skip reads the next value, whatever it is.
func (s *Scanner) Skip() {
	s.Space()
	switch s.Peek() {
	case '"':
		s.Str()
	case '{', '[':
		depth := 0
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case '"':
				s.Str()
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			s.i++
			if depth == 0 {
				return
			}
		}
	default: // a number, true, false or null
		for s.i < len(s.b) && strings.IndexByte(",}] \t\r\n", s.b[s.i]) < 0 {
			s.i++
		}
	}
}

// Value reads the next value, whatever it is, and returns it as written.
func (s *Scanner) Value() []byte {
	s.Space()
	start := s.i
	s.Skip()
	return s.b[start:s.i]
}

// Object reads an object, calling member with each key, unquoted, and
// the scanner at its value, which member must read; false when no object
// comes next. An error from member ends the reading and is returned.
func (s *Scanner) Object(member func(key string) error) (bool, error) {
	s.Space()
	if !s.Byte('{') {
		return false, nil
	}
	for s.Space(); !s.Byte('}'); s.Space() {
		s.Byte(',')
		s.Space()
		raw, _ := s.Str()
		key, err := Unquote(raw)
		if err != nil {
			return true, err
		}
		s.Space()
		s.Byte(':')
		s.Space()
		if err := member(key); err != nil {
			return true, err
		}
	}
	return true, nil
}

// Unquote is the string a Str token stands for.
func Unquote(raw []byte) (string, error) {
	if len(raw) >= 2 && bytes.IndexByte(raw[1:len(raw)-1], '\\') < 0 {
		return string(raw[1 : len(raw)-1]), nil
	}
	var v string
	err := json.Unmarshal(raw, &v)
	return v, err
}

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// decodeEvent reads one JSON watch line,
// {"type":T,"object":{..."metadata":{..."resourceVersion":RV,...},...}}, and
// returns T and the object's metadata.resourceVersion ("" when it has none, as
// an ERROR event's Status). It walks the JSON structure (strings, escapes,
// nesting) but builds nothing else, so a "resourceVersion" anywhere else in the
// object (data, annotations, managedFields) is not taken for the object's, and
// the members may come in any order. The harness shares the CPUs with what it
// measures: walking a line costs a fraction of a full decode. An error for a
// line that is not one JSON object with a string "type".
func decodeEvent(line []byte) (eventType, resourceVersion string, err error) {
	s := scanner{b: line}
	haveType := false
	err = s.object(func(key []byte) error {
		switch string(key) {
		case "type":
			value, err := s.str()
			eventType, haveType = string(value), true
			return err
		case "object":
			return s.object(func(key []byte) error {
				if string(key) != "metadata" {
					return s.skip()
				}
				return s.object(func(key []byte) error {
					if string(key) != "resourceVersion" {
						return s.skip()
					}
					value, err := s.str()
					resourceVersion = string(value)
					return err
				})
			})
		default:
			return s.skip()
		}
	})
	if err != nil {
		return "", "", err
	}
	if s.space(); s.i != len(s.b) {
		return "", "", s.fail("end of line")
	}
	if !haveType {
		return "", "", errors.New("no string \"type\"")
	}
	return eventType, resourceVersion, nil
}

// scanner walks JSON in b from offset i.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) fail(want string) error {
	if s.i >= len(s.b) {
		return fmt.Errorf("offset %d: want %s, line ends", s.i, want)
	}
	return fmt.Errorf("offset %d: want %s, found %q", s.i, want, s.b[s.i])
}

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// object reads the object at s.i, calling member with each key; member must
// consume the key's value (s.skip, s.str or s.object).
func (s *scanner) object(member func(key []byte) error) error {
	if s.space(); s.i >= len(s.b) || s.b[s.i] != '{' {
		return s.fail("'{'")
	}
	s.i++
	if s.space(); s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return nil
	}
	for {
		key, err := s.str()
		if err != nil {
			return err
		}
		if s.space(); s.i >= len(s.b) || s.b[s.i] != ':' {
			return s.fail("':'")
		}
		s.i++
		if err := member(key); err != nil {
			return err
		}
		if s.space(); s.i >= len(s.b) {
			return s.fail("',' or '}'")
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return s.fail("',' or '}'")
		}
	}
}

// str reads the string at s.i and returns its value: a slice of b when it has
// no escapes (every key and value the harness looks at), decoded otherwise.
func (s *scanner) str() ([]byte, error) {
	if s.space(); s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, s.fail("a string")
	}
	start := s.i
	raw, escaped, err := s.rawString()
	if err != nil || !escaped {
		return raw, err
	}
	var value string
	if err := json.Unmarshal(s.b[start:s.i], &value); err != nil {
		return nil, err
	}
	return []byte(value), nil
}

// rawString moves past the string that starts at s.i (a '"') and returns its
// bytes between the quotes, and whether they hold an escape.
func (s *scanner) rawString() (raw []byte, escaped bool, err error) {
	start := s.i + 1
	for j := start; j < len(s.b); {
		quote := bytes.IndexByte(s.b[j:], '"')
		if quote < 0 {
			break
		}
		backslash := bytes.IndexByte(s.b[j:j+quote], '\\')
		if backslash < 0 {
			s.i = j + quote + 1
			return s.b[start : j+quote], escaped, nil
		}
		escaped = true
		j += backslash + 2 // the backslash and the character it escapes
	}
	s.i = len(s.b)
	return nil, false, s.fail("the end of a string")
}

// skip moves past the value at s.i. Nested objects and arrays are skipped by
// counting brackets outside strings: fast, and enough for the apiserver's
// well-formed lines (a mismatched bracket is not diagnosed).
func (s *scanner) skip() error {
	if s.space(); s.i >= len(s.b) {
		return s.fail("a value")
	}
	switch s.b[s.i] {
	case '"':
		_, _, err := s.rawString()
		return err
	case '{', '[':
		depth := 0
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case '"':
				if _, _, err := s.rawString(); err != nil {
					return err
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					s.i++
					return nil
				}
			}
			s.i++
		}
		return s.fail("the end of an object or array")
	default: // a number, true, false or null
		start := s.i
		for ; s.i < len(s.b); s.i++ {
			switch s.b[s.i] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				if s.i == start {
					return s.fail("a value")
				}
				return nil
			}
		}
		return nil
	}
}

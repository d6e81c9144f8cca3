package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// A ConfigMap event as the apiserver writes it (and warmwatch stores it).
const modified = `{"type":"MODIFIED","object":{"kind":"ConfigMap","apiVersion":"v1",` +
	`"metadata":{"name":"cm-0000042","namespace":"fanout","uid":"0b6f","resourceVersion":"12345",` +
	`"creationTimestamp":"2026-01-01T00:00:00Z","labels":{"tier":"b"},"managedFields":[{"manager":` +
	`"python","operation":"Update","apiVersion":"v1","fieldsType":"FieldsV1","fieldsV1":{"f:data":` +
	`{".":{},"f:payload":{},"f:seq":{}}}}]},"data":{"payload":"xxxxxxxx","seq":"42"}}}`

func TestDecodeEvent(t *testing.T) {
	cases := []struct {
		name, line, eventType, rv string
	}{
		{"apiserver's order", modified, "MODIFIED", "12345"},
		{
			"bookmark",
			`{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":` +
				`{"resourceVersion":"777","creationTimestamp":null,"annotations":` +
				`{"k8s.io/initial-events-end":"true"}}}}`,
			"BOOKMARK", "777",
		},
		{
			"error Status, no resourceVersion",
			`{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},` +
				`"status":"Failure","message":"too old resource version: 1 (5)","reason":"Expired","code":410}}`,
			"ERROR", "",
		},
		{
			"members in another order, spaces",
			` { "object" : { "metadata" : { "labels" : { "a" : "b" } , "resourceVersion" : "9" } } ,` +
				` "type" : "ADDED" } `,
			"ADDED", "9",
		},
		{
			"resourceVersion elsewhere is not the object's",
			`{"type":"ADDED","object":{"data":{"resourceVersion":"1"},"metadata":{"annotations":` +
				`{"resourceVersion":"2"},"ownerReferences":[{"resourceVersion":"3"}],` +
				`"resourceVersion":"4"},"status":{"metadata":{"resourceVersion":"5"}}}}`,
			"ADDED", "4",
		},
		{
			"escapes, brackets and quotes inside strings",
			`{"type":"DELETED","object":{"data":{"x":"}]\"{[\\","y":"\\\"}"},"metadata":` +
				`{"name":"a\"b","resourceVersion":"6"}}}`,
			"DELETED", "6",
		},
		{
			"escaped key and value",
			`{"typ\u0065":"ADDED","object":{"metadata":{"resourceVersion":"\u0038"}}}`,
			"ADDED", "8",
		},
		{
			"numbers, literals and arrays skipped",
			`{"type":"ADDED","n":-1.5e3,"t":true,"f":false,"z":null,"a":[1,[2,{"b":[]}],"c"],` +
				`"object":{"metadata":{"generation":3,"resourceVersion":"10"}}}`,
			"ADDED", "10",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			eventType, rv, err := decodeEvent([]byte(c.line))
			if err != nil {
				t.Fatalf("decodeEvent: %v", err)
			}
			if eventType != c.eventType || rv != c.rv {
				t.Fatalf("got (%q, %q), want (%q, %q)", eventType, rv, c.eventType, c.rv)
			}
			wantType, wantRV, err := reference([]byte(c.line))
			if err != nil || wantType != eventType || wantRV != rv {
				t.Fatalf("encoding/json says (%q, %q, %v)", wantType, wantRV, err)
			}
		})
	}
}

func TestDecodeEventRefuses(t *testing.T) {
	for _, line := range []string{
		``,
		`   `,
		`[]`,
		`"type"`,
		`{}`,                            // no type
		`{"object":{"metadata":{}}}`,    // no type
		`{"type":1,"object":{}}`,        // type not a string
		`{"type":"ADDED","object":"x"}`, // object not an object
		`{"type":"ADDED","object":{"metadata":{"resourceVersion":7}}}`, // RV not a string
		`{"type":"ADDED"`, // cut short
		`{"type":"ADDED","object":{"metadata":{"resourceVersion":"1"}}`,
		`{"type":"ADDED","object":{"data":{"a":"b}}}`, // string never ends
		`{"type":"ADDED","object":{"data":[1,2}}`,     // array never ends
		`{"type":"ADDED"}{"type":"ADDED"}`,            // two objects
		`{"type":"ADDED",}`,
		`{"type" "ADDED"}`,
		`{"type":"ADDED","x":}`,
		`{"type":"ADDED\"}`,
	} {
		if eventType, rv, err := decodeEvent([]byte(line)); err == nil {
			t.Errorf("%s: got (%q, %q), want an error", line, eventType, rv)
		}
	}
}

// reference decodes the same two fields with encoding/json.
func reference(line []byte) (string, string, error) {
	var event struct {
		Type   *string `json:"type"`
		Object struct {
			Metadata struct {
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		} `json:"object"`
	}
	if err := json.Unmarshal(line, &event); err != nil {
		return "", "", err
	}
	if event.Type == nil {
		return "", "", nil
	}
	return *event.Type, event.Object.Metadata.ResourceVersion, nil
}

// FuzzDecodeEvent: no line makes decodeEvent panic, and an event as
// encoding/json writes it (any data in it, any escapes; the line made from the
// fuzzed one when it has the event's form) is read as encoding/json reads it.
func FuzzDecodeEvent(f *testing.F) {
	f.Add(modified)
	f.Add(`{"type":"ERROR","object":{"kind":"Status","metadata":{}}}`)
	f.Add(`{"object":{"metadata":{"resourceVersion":"1","x":["]"]}},"type":"A<\\u0026"}`)
	f.Fuzz(func(t *testing.T, line string) {
		_, _, _ = decodeEvent([]byte(line))
		canonical, ok := rewritten(line)
		if !ok {
			return
		}
		eventType, rv, err := decodeEvent(canonical)
		wantType, wantRV, _ := reference(canonical)
		if err != nil || eventType != wantType || rv != wantRV {
			t.Fatalf("%s: got (%q, %q, %v), want (%q, %q)", canonical, eventType, rv, err, wantType, wantRV)
		}
	})
}

// rewritten is line written again by encoding/json when it is an event: an
// object with a string "type", and an "object" and its "metadata" objects
// (when present) with a string "resourceVersion" (when present), each member
// named exactly (encoding/json also matches names case-insensitively).
func rewritten(line string) ([]byte, bool) {
	var top map[string]json.RawMessage
	if json.Unmarshal([]byte(line), &top) != nil || top == nil || !exactNames(top) {
		return nil, false
	}
	var eventType string
	if json.Unmarshal(top["type"], &eventType) != nil {
		return nil, false
	}
	if raw, ok := top["object"]; ok {
		var object map[string]json.RawMessage
		if json.Unmarshal(raw, &object) != nil || object == nil || !exactNames(object) {
			return nil, false
		}
		if raw, ok := object["metadata"]; ok {
			var metadata map[string]json.RawMessage
			if json.Unmarshal(raw, &metadata) != nil || metadata == nil || !exactNames(metadata) {
				return nil, false
			}
			var rv string
			if raw, ok := metadata["resourceVersion"]; ok && json.Unmarshal(raw, &rv) != nil {
				return nil, false
			}
			object["metadata"], _ = json.Marshal(metadata)
		}
		top["object"], _ = json.Marshal(object)
	}
	canonical, err := json.Marshal(top)
	return canonical, err == nil
}

func exactNames(m map[string]json.RawMessage) bool {
	for name := range m {
		for _, wanted := range []string{"type", "object", "metadata", "resourceVersion"} {
			if name != wanted && strings.EqualFold(name, wanted) {
				return false
			}
		}
	}
	return true
}

func BenchmarkDecodeEvent(b *testing.B) {
	line := []byte(modified)
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		if _, _, err := decodeEvent(line); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReference(b *testing.B) {
	line := []byte(modified)
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		if _, _, err := reference(line); err != nil {
			b.Fatal(err)
		}
	}
}

package main

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func configMap(ns, name, rv string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: rv, Labels: map[string]string{"b": "2", "a": "1"}},
		Data:       data,
	}
}

func TestObjectDigestHashesWholeObjectsInDigestOrder(t *testing.T) {
	x := configMap("ns", "x", "5", map[string]string{"k": "v"})
	y := configMap("ns", "y", "6", map[string]string{"k": "w"})
	d := buildDigest("v1/configmaps", itemsFromObjects([]interface{}{y, x}, true), true, true)

	xJSON, _ := json.Marshal(x)
	yJSON, _ := json.Marshal(y)
	if want := sha(string(xJSON) + "\n" + string(yJSON) + "\n"); d.Objects != want {
		t.Errorf("objects = %s, want %s (sorted by ns/name, json.Marshal + newline)", d.Objects, want)
	}
	if d.ObjectHashes == nil || len(*d.ObjectHashes) != 2 ||
		(*d.ObjectHashes)[0] != sha(string(xJSON)) || (*d.ObjectHashes)[1] != sha(string(yJSON)) {
		t.Errorf("objectHashes = %v", d.ObjectHashes)
	}
	// The map order of labels does not matter: json.Marshal sorts keys.
	if !strings.Contains(string(xJSON), `"labels":{"a":"1","b":"2"}`) {
		t.Errorf("not canonical: %s", xJSON)
	}

	// A change the ns/name/rv digest cannot see (same RV, other data) changes objects.
	x2 := configMap("ns", "x", "5", map[string]string{"k": "changed"})
	d2 := buildDigest("v1/configmaps", itemsFromObjects([]interface{}{x2, y}, true), true, true)
	if d2.SHA256 != d.SHA256 {
		t.Errorf("sha256 changed with the data: %s vs %s", d2.SHA256, d.SHA256)
	}
	if d2.Objects == d.Objects || (*d2.ObjectHashes)[0] == (*d.ObjectHashes)[0] || (*d2.ObjectHashes)[1] != (*d.ObjectHashes)[1] {
		t.Errorf("objects did not follow the data change: %s %v vs %s %v", d2.Objects, *d2.ObjectHashes, d.Objects, *d.ObjectHashes)
	}

	// Unstructured objects hash their maps; without --object-digest nothing is added.
	u := &unstructured.Unstructured{Object: map[string]interface{}{"metadata": map[string]interface{}{"name": "u", "namespace": "ns", "resourceVersion": "1"}}}
	du := buildDigest("r", itemsFromObjects([]interface{}{u}, true), false, true)
	uJSON, _ := json.Marshal(u.Object)
	if du.Objects != sha(string(uJSON)+"\n") || du.ObjectHashes != nil {
		t.Errorf("unstructured: objects %s hashes %v (want no hashes with --no-items)", du.Objects, du.ObjectHashes)
	}
	plain, _ := json.Marshal(buildDigest("r", itemsFromObjects([]interface{}{u}, false), true, false))
	if strings.Contains(string(plain), "objects") {
		t.Errorf("object fields without --object-digest: %s", plain)
	}
	// The empty store: the hash of nothing, an empty list of hashes.
	empty, _ := json.Marshal(buildDigest("r", nil, true, true))
	if !strings.Contains(string(empty), `"objects":"`+sha("")+`","objectHashes":[]`) {
		t.Errorf("empty: %s", empty)
	}
}

func TestObjectLines(t *testing.T) {
	x := configMap("ns", "x", "5", map[string]string{"k": "v"})
	a := configMap("ns", "a", "6", nil)
	lines := objectLines("v1/configmaps", []interface{}{x, a})
	b, _ := json.Marshal(lines)
	ax, _ := json.Marshal(a)
	xx, _ := json.Marshal(x)
	want := `[{"kind":"object","resource":"v1/configmaps","namespace":"ns","name":"a","object":` + string(ax) +
		`},{"kind":"object","resource":"v1/configmaps","namespace":"ns","name":"x","object":` + string(xx) + `}]`
	if string(b) != want {
		t.Errorf("got  %s\nwant %s", b, want)
	}
}

package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func TestBuildDigestSortsAndHashes(t *testing.T) {
	items := []item{
		{Namespace: "b", Name: "x", RV: "7"},
		{Namespace: "a", Name: "z", RV: "3"},
		{Namespace: "", Name: "cluster-thing", RV: "1"},
		{Namespace: "a", Name: "y", RV: "10"},
		{Namespace: "a", Name: "Y", RV: "11"}, // byte order: upper case first
	}
	d := buildDigest("v1/configmaps", items, true, false)
	want := []item{
		{Namespace: "", Name: "cluster-thing", RV: "1"},
		{Namespace: "a", Name: "Y", RV: "11"},
		{Namespace: "a", Name: "y", RV: "10"},
		{Namespace: "a", Name: "z", RV: "3"},
		{Namespace: "b", Name: "x", RV: "7"},
	}
	if d.Count != len(want) || d.Items == nil || len(*d.Items) != len(want) {
		t.Fatalf("count %d items %v", d.Count, d.Items)
	}
	for i, it := range *d.Items {
		if it.key() != want[i].key() {
			t.Errorf("item %d = %v, want %v", i, it.key(), want[i].key())
		}
	}
	wantSHA := sha("/cluster-thing/1\na/Y/11\na/y/10\na/z/3\nb/x/7\n")
	if d.SHA256 != wantSHA {
		t.Errorf("sha256 = %s, want %s", d.SHA256, wantSHA)
	}
	// The hash does not depend on input order.
	rev := []item{want[4], want[3], want[2], want[1], want[0]}
	if got := buildDigest("v1/configmaps", rev, false, false).SHA256; got != wantSHA {
		t.Errorf("sha256 of reversed input = %s, want %s", got, wantSHA)
	}
}

func TestDigestLineFormat(t *testing.T) {
	d := buildDigest("apps/v1/deployments@ns1", []item{{Namespace: "ns1", Name: "b", RV: "5"}, {Namespace: "ns1", Name: "a", RV: "4"}}, true, false)
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"kind":"digest","resource":"apps/v1/deployments@ns1","count":2,"sha256":"` +
		sha("ns1/a/4\nns1/b/5\n") + `","items":[["ns1","a","4"],["ns1","b","5"]]}`
	if string(b) != want {
		t.Errorf("got  %s\nwant %s", b, want)
	}

	// --no-items drops the array.
	b, _ = json.Marshal(buildDigest("v1/configmaps", []item{{Namespace: "a", Name: "b", RV: "1"}}, false, false))
	want = `{"kind":"digest","resource":"v1/configmaps","count":1,"sha256":"` + sha("a/b/1\n") + `"}`
	if string(b) != want {
		t.Errorf("got  %s\nwant %s", b, want)
	}

	// An empty cache still has an items array, and the sha256 of nothing.
	b, _ = json.Marshal(buildDigest("v1/configmaps", nil, true, false))
	want = `{"kind":"digest","resource":"v1/configmaps","count":0,"sha256":"` + sha("") + `","items":[]}`
	if string(b) != want {
		t.Errorf("got  %s\nwant %s", b, want)
	}
}

func TestItemsFromObjects(t *testing.T) {
	u := &unstructured.Unstructured{}
	u.SetNamespace("default")
	u.SetName("cm1")
	u.SetResourceVersion("42")
	p := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "node1", ResourceVersion: "9"}}
	got := itemsFromObjects([]interface{}{u, p, "not an object"}, false)
	want := []item{{Namespace: "default", Name: "cm1", RV: "42"}, {Namespace: "", Name: "node1", RV: "9"}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i].key() != want[i].key() || got[i].object != nil {
			t.Errorf("item %d = %v (object %q), want %v", i, got[i].key(), got[i].object, want[i].key())
		}
	}
}

func TestParseResourceSpec(t *testing.T) {
	cases := []struct {
		in   string
		gvr  schema.GroupVersionResource
		ns   string
		fail bool
	}{
		{in: "v1/configmaps", gvr: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}},
		{in: "apps/v1/deployments", gvr: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}},
		{in: "example.com/v1/widgets@team-a", gvr: schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}, ns: "team-a"},
		{in: "v1/configmaps@default", gvr: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, ns: "default"},
		{in: "configmaps", fail: true},
		{in: "a/b/c/d", fail: true},
		{in: "v1//configmaps", fail: true},
		{in: "v1/configmaps@", fail: true},
		{in: "", fail: true},
	}
	for _, c := range cases {
		r, err := parseResourceSpec(c.in)
		if c.fail {
			if err == nil {
				t.Errorf("%q: want error, got %+v", c.in, r)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", c.in, err)
			continue
		}
		if r.GVR != c.gvr || r.Namespace != c.ns || r.Spec != c.in {
			t.Errorf("%q: got %+v", c.in, r)
		}
	}
}

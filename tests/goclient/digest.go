package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sort"

	"k8s.io/apimachinery/pkg/api/meta"
)

// item is one cached object: namespace, name, resourceVersion, and with --object-digest
// the canonical JSON of the whole object.
type item struct {
	Namespace, Name, RV string
	object              []byte // nil unless object digests were asked for
}

// key is the item without its object.
func (it item) key() [3]string { return [3]string{it.Namespace, it.Name, it.RV} }

// MarshalJSON renders an item as ["ns","name","rv"].
func (it item) MarshalJSON() ([]byte, error) {
	return json.Marshal(it.key())
}

// digestLine is the {"kind":"digest",...} output line.
type digestLine struct {
	Kind     string  `json:"kind"`
	Resource string  `json:"resource"`
	Count    int     `json:"count"`
	SHA256   string  `json:"sha256"`
	Items    *[]item `json:"items,omitempty"`
	// With --object-digest: sha256 over every object's canonical JSON, and (unless
	// --no-items) each object's own sha256, in the order of items.
	Objects      string    `json:"objects,omitempty"`
	ObjectHashes *[]string `json:"objectHashes,omitempty"`
}

// sortItems sorts by namespace, then name (then rv, so the order is total).
func sortItems(items []item) {
	sort.Slice(items, func(i, j int) bool {
		a, b := items[i], items[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		return a.RV < b.RV
	})
}

// digestSHA256 is the hex sha256 over "ns/name/rv\n" for each item, in the
// given order (callers sort first). Cluster-scoped objects have ns "".
func digestSHA256(items []item) string {
	h := sha256.New()
	for _, it := range items {
		h.Write([]byte(it.Namespace))
		h.Write([]byte{'/'})
		h.Write([]byte(it.Name))
		h.Write([]byte{'/'})
		h.Write([]byte(it.RV))
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// objectsSHA256 is the hex sha256 over each item's canonical object JSON followed by "\n",
// in the given order, and each object's own hex sha256.
func objectsSHA256(items []item) (string, []string) {
	h := sha256.New()
	each := make([]string, len(items))
	for i, it := range items {
		h.Write(it.object)
		h.Write([]byte{'\n'})
		sum := sha256.Sum256(it.object)
		each[i] = hex.EncodeToString(sum[:])
	}
	return hex.EncodeToString(h.Sum(nil)), each
}

// buildDigest sorts items in place and returns the digest line for them (with object
// digests when withObjects: items must then carry their objects).
func buildDigest(resource string, items []item, withItems, withObjects bool) digestLine {
	if items == nil {
		items = []item{}
	}
	sortItems(items)
	d := digestLine{
		Kind:     "digest",
		Resource: resource,
		Count:    len(items),
		SHA256:   digestSHA256(items),
	}
	if withItems {
		d.Items = &items
	}
	if withObjects {
		all, each := objectsSHA256(items)
		d.Objects = all
		if withItems {
			d.ObjectHashes = &each
		}
	}
	return d
}

// itemsFromObjects turns store contents (unstructured objects, PartialObjectMetadata,
// typed objects) into items, with each object's canonical JSON when withObjects. Objects
// without metadata are skipped.
func itemsFromObjects(objs []interface{}, withObjects bool) []item {
	out := make([]item, 0, len(objs))
	for _, o := range objs {
		m, err := meta.Accessor(o)
		if err != nil {
			continue
		}
		it := item{Namespace: m.GetNamespace(), Name: m.GetName(), RV: m.GetResourceVersion()}
		if withObjects {
			it.object = canonicalJSON(o)
		}
		out = append(out, it)
	}
	return out
}

// canonicalJSON is json.Marshal of the object as the informer holds it (typed structs in
// field order, unstructured maps with sorted keys; nothing cleared): equal objects of the
// same Go type give equal bytes. An object that cannot be marshalled gives its error text,
// so it cannot collide with a real object.
func canonicalJSON(o interface{}) []byte {
	b, err := json.Marshal(o)
	if err != nil {
		return []byte("marshal error: " + err.Error())
	}
	return b
}

// objectLine is one {"kind":"object",...} line of a dump: an informer's object whole, as
// canonicalJSON renders it (what --object-digest hashes).
type objectLine struct {
	Kind      string          `json:"kind"`
	Resource  string          `json:"resource"`
	Namespace string          `json:"namespace"`
	Name      string          `json:"name"`
	Object    json.RawMessage `json:"object"`
}

// objectLines: the store's objects sorted as in a digest.
func objectLines(resource string, objs []interface{}) []objectLine {
	items := itemsFromObjects(objs, true)
	sortItems(items)
	out := make([]objectLine, len(items))
	for i, it := range items {
		obj := it.object
		if !json.Valid(obj) {
			obj, _ = json.Marshal(string(obj))
		}
		out[i] = objectLine{Kind: "object", Resource: resource, Namespace: it.Namespace, Name: it.Name, Object: obj}
	}
	return out
}

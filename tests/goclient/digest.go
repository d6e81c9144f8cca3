package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sort"

	"k8s.io/apimachinery/pkg/api/meta"
)

// item is one cached object: namespace, name, resourceVersion.
type item struct {
	Namespace, Name, RV string
}

// MarshalJSON renders an item as ["ns","name","rv"].
func (it item) MarshalJSON() ([]byte, error) {
	return json.Marshal([3]string{it.Namespace, it.Name, it.RV})
}

// digestLine is the {"kind":"digest",...} output line.
type digestLine struct {
	Kind     string  `json:"kind"`
	Resource string  `json:"resource"`
	Count    int     `json:"count"`
	SHA256   string  `json:"sha256"`
	Items    *[]item `json:"items,omitempty"`
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

// buildDigest sorts items in place and returns the digest line for them.
func buildDigest(resource string, items []item, withItems bool) digestLine {
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
	return d
}

// itemsFromObjects turns store contents (unstructured objects, PartialObjectMetadata,
// typed objects) into items. Objects without metadata are skipped.
func itemsFromObjects(objs []interface{}) []item {
	out := make([]item, 0, len(objs))
	for _, o := range objs {
		m, err := meta.Accessor(o)
		if err != nil {
			continue
		}
		out = append(out, item{m.GetNamespace(), m.GetName(), m.GetResourceVersion()})
	}
	return out
}

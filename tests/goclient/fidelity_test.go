package main

import (
	"bytes"
	"encoding/binary"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// fakeServer answers protobuf LIST, WatchList and metadata LIST of configmaps in ns, the
// way the apiserver frames them; its fields let a test make it differ.
type fakeServer struct {
	t       *testing.T
	objects []*corev1.ConfigMap
	listRV  string
	// itemBytes may rewrite one item's message bytes (in LIST and WatchList).
	itemBytes func(i int, raw []byte) []byte
	// bookmarkAnnotation: false drops the initial-events-end annotation.
	noBookmarkAnnotation bool
	jsonMetadata         bool // answer the metadata LIST in JSON
	envelopedFrames      bool // watch frames as enveloped WatchEvents (the apiserver's are bare)
	bookmarkData         map[string]string
}

func envelope(t *testing.T, apiVersion, kind string, raw []byte) []byte {
	t.Helper()
	unk := runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: apiVersion, Kind: kind}, Raw: raw}
	b, err := unk.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return append(append([]byte{}, protobufMagic...), b...)
}

// listMessage is a *List message: ListMeta (field 1), then the items (field 2).
func listMessage(t *testing.T, rv string, items [][]byte) []byte {
	t.Helper()
	lm, err := (&metav1.ListMeta{ResourceVersion: rv}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	b := protowire.AppendTag(nil, 1, protowire.BytesType)
	b = protowire.AppendBytes(b, lm)
	for _, it := range items {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, it)
	}
	return b
}

func (f *fakeServer) items(metadataOnly bool) [][]byte {
	var out [][]byte
	for i, o := range f.objects {
		var raw []byte
		var err error
		if metadataOnly {
			raw, err = (&metav1.PartialObjectMetadata{ObjectMeta: o.ObjectMeta}).Marshal()
		} else {
			raw, err = o.Marshal()
			if f.itemBytes != nil {
				raw = f.itemBytes(i, raw)
			}
		}
		if err != nil {
			f.t.Fatal(err)
		}
		out = append(out, raw)
	}
	return out
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/api/v1/namespaces/ns/configmaps" {
		http.NotFound(w, r)
		return
	}
	q := r.URL.Query()
	accept := r.Header.Get("Accept")
	switch {
	case q.Get("watch") == "true":
		if q.Get("sendInitialEvents") != "true" || q.Get("resourceVersionMatch") != "NotOlderThan" || q.Get("allowWatchBookmarks") != "true" {
			http.Error(w, "not a WatchList: "+r.URL.RawQuery, http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/vnd.kubernetes.protobuf;stream=watch")
		frame := func(typ string, obj []byte) {
			ev, err := (&metav1.WatchEvent{Type: typ, Object: runtime.RawExtension{Raw: obj}}).Marshal()
			if err != nil {
				f.t.Fatal(err)
			}
			if f.envelopedFrames {
				ev = envelope(f.t, "v1", "WatchEvent", ev)
			}
			var n [4]byte
			binary.BigEndian.PutUint32(n[:], uint32(len(ev)))
			_, _ = w.Write(n[:])
			_, _ = w.Write(ev)
		}
		for _, raw := range f.items(false) {
			frame("ADDED", envelope(f.t, "v1", "ConfigMap", raw))
		}
		bm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{ResourceVersion: f.listRV}, Data: f.bookmarkData}
		if !f.noBookmarkAnnotation {
			bm.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
		}
		raw, _ := bm.Marshal()
		frame("BOOKMARK", envelope(f.t, "v1", "ConfigMap", raw))
		// The stream stays open, as a real watch does, until timeoutSeconds: the reader
		// must stop by itself at the bookmark.
		w.(http.Flusher).Flush()
		timeout, _ := time.ParseDuration(q.Get("timeoutSeconds") + "s")
		select {
		case <-r.Context().Done():
		case <-time.After(timeout):
		}
	case strings.Contains(accept, "as=PartialObjectMetadataList"):
		if f.jsonMetadata {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{},"items":[]}`))
			return
		}
		w.Header().Set("Content-Type", "application/vnd.kubernetes.protobuf")
		_, _ = w.Write(envelope(f.t, "meta.k8s.io/v1", "PartialObjectMetadataList", listMessage(f.t, f.listRV, f.items(true))))
	default:
		w.Header().Set("Content-Type", "application/vnd.kubernetes.protobuf")
		_, _ = w.Write(envelope(f.t, "v1", "ConfigMapList", listMessage(f.t, f.listRV, f.items(false))))
	}
}

func newFake(t *testing.T, rv string) *fakeServer {
	return &fakeServer{t: t, listRV: rv, objects: []*corev1.ConfigMap{
		configMap("ns", "a", "10", map[string]string{"k": "1"}),
		configMap("ns", "b", "11", map[string]string{"k": "2"}),
		configMap("ns", "c", "12", nil),
	}}
}

func compareServers(t *testing.T, a, b *fakeServer) map[string]fidelityLine {
	t.Helper()
	sa, sb := httptest.NewServer(a), httptest.NewServer(b)
	defer sa.Close()
	defer sb.Close()
	spec, _ := parseResourceSpec("v1/configmaps@ns")
	c := newFidelityChecker(5*time.Second, "", "")
	lines := map[string]fidelityLine{}
	for _, check := range fidelityChecks {
		fa := c.fetch(server{base: sa.URL, hc: sa.Client()}, spec, check)
		fb := c.fetch(server{base: sb.URL, hc: sb.Client()}, spec, check)
		line := fidelityLine{Kind: "fidelity", Resource: spec.Spec, Check: check, A: fa.report, B: fb.report}
		compareFetched(&line, fa, fb)
		lines[check] = line
	}
	return lines
}

func TestFidelityEqualServersDifferOnlyInListRV(t *testing.T) {
	lines := compareServers(t, newFake(t, "100"), newFake(t, "90"))
	for check, l := range lines {
		if !l.OK || !l.SameKeys || !l.DecodedEqual || !l.RawEqual || !l.EnvelopeEqual || !l.SameOrder || len(l.Differences) > 0 {
			t.Errorf("%s: %+v", check, l)
		}
		if l.A.Count != 3 || l.B.Count != 3 || l.A.RV != "100" || l.B.RV != "90" {
			t.Errorf("%s: counts %d/%d rvs %q/%q", check, l.A.Count, l.B.Count, l.A.RV, l.B.RV)
		}
	}
	if l := lines["list"]; l.A.Envelope != "v1 ConfigMapList" || l.A.ContentType != "application/vnd.kubernetes.protobuf" {
		t.Errorf("list envelope: %+v", l.A)
	}
	if l := lines["metadata-list"]; l.A.Envelope != "meta.k8s.io/v1 PartialObjectMetadataList" {
		t.Errorf("metadata envelope: %+v", l.A)
	}
	if l := lines["watchlist"]; l.BookmarkEqual == nil || !*l.BookmarkEqual || l.A.BookmarkRaw == "" || l.A.BookmarkRaw == l.B.BookmarkRaw {
		t.Errorf("watchlist bookmark: equal %v, raw %q vs %q (RVs differ)", l.BookmarkEqual, l.A.BookmarkRaw, l.B.BookmarkRaw)
	}
	if l := lines["list"]; l.BookmarkEqual != nil {
		t.Errorf("list: bookmarkEqual %v", *l.BookmarkEqual)
	}
	if l := lines["watchlist"]; l.A.Envelope != "WatchEvent ADDED,BOOKMARK" || l.A.ObjectEnvelope != `v1 ConfigMap encoding="" contentType=""` || l.A.BookmarkAnnotations[metav1.InitialEventsAnnotationKey] != "true" {
		t.Errorf("watchlist: %+v", l.A)
	}
}

func TestFidelityFindsRawDifferencesDecodingHides(t *testing.T) {
	b := newFake(t, "100")
	// An unknown field appended to item 1: client-go's decoder skips it, the bytes differ.
	b.itemBytes = func(i int, raw []byte) []byte {
		if i != 1 {
			return raw
		}
		return protowire.AppendBytes(protowire.AppendTag(raw, 99, protowire.BytesType), []byte("x"))
	}
	lines := compareServers(t, newFake(t, "100"), b)
	for _, check := range []string{"list", "watchlist"} {
		l := lines[check]
		if l.OK || l.RawEqual || !l.DecodedEqual || !l.SameKeys {
			t.Errorf("%s: %+v", check, l)
		}
		if len(l.Differences) != 1 || !strings.Contains(l.Differences[0], "ns/b@11: raw protobuf differs") {
			t.Errorf("%s differences: %q", check, l.Differences)
		}
	}
	if !lines["metadata-list"].OK {
		t.Errorf("metadata-list: %+v", lines["metadata-list"])
	}
}

func TestFidelityReportsBookmarkDifferencesApart(t *testing.T) {
	b := newFake(t, "100")
	b.bookmarkData = map[string]string{"x": "y"}
	l := compareServers(t, newFake(t, "100"), b)["watchlist"]
	if !l.OK || l.BookmarkEqual == nil || *l.BookmarkEqual || len(l.Differences) != 1 ||
		!strings.Contains(l.Differences[0], "initial-events-end bookmark (RV aside) differs") || !strings.Contains(l.Differences[0], `+  "x": "y"`) {
		t.Errorf("%+v", l)
	}
}

func TestFidelityFindsDecodedAndKeyDifferences(t *testing.T) {
	b := newFake(t, "100")
	b.objects[0] = configMap("ns", "a", "10", map[string]string{"k": "other"}) // same key, other data
	b.objects[2] = configMap("ns", "d", "13", nil)                             // c missing, d extra
	lines := compareServers(t, newFake(t, "100"), b)
	l := lines["list"]
	if l.OK || l.DecodedEqual || l.SemanticEqual || l.RawEqual || l.SameKeys {
		t.Errorf("list: %+v", l)
	}
	all := strings.Join(l.Differences, "\n")
	for _, want := range []string{"ns/a@10: decoded objects differ", "only in a: ns/c@12", "only in b: ns/d@13"} {
		if !strings.Contains(all, want) {
			t.Errorf("list differences lack %q:\n%s", want, all)
		}
	}
	if m := lines["metadata-list"]; m.OK || m.SameKeys || !m.RawEqual {
		t.Errorf("metadata-list: %+v", m) // a's metadata is unchanged: only the keys differ
	}
}

func TestFidelityFindsEnvelopeDifferences(t *testing.T) {
	b := newFake(t, "100")
	b.noBookmarkAnnotation = true // the WatchList does not end: until timeoutSeconds
	b.jsonMetadata = true
	sa, sb := httptest.NewServer(newFake(t, "100")), httptest.NewServer(b)
	defer sa.Close()
	defer sb.Close()
	spec, _ := parseResourceSpec("v1/configmaps@ns")
	c := newFidelityChecker(time.Second, "", "")
	for check, want := range map[string]string{
		"metadata-list": `b: metadata-list: not a protobuf message (starts "{\"kind\":\"Partial")`,
		"watchlist":     "b: watch: stream ended before the initial-events-end bookmark",
	} {
		fa := c.fetch(server{base: sa.URL, hc: sa.Client()}, spec, check)
		fb := c.fetch(server{base: sb.URL, hc: sb.Client()}, spec, check)
		line := fidelityLine{}
		compareFetched(&line, fa, fb)
		if line.OK || line.EnvelopeEqual || line.SameKeys || line.RawEqual || len(line.Differences) == 0 || line.Differences[0] != want {
			t.Errorf("%s: %+v", check, line)
		}
		if check == "watchlist" && (fb.report.OtherBookmarks != 1 || fb.report.Count != 3) {
			// the bookmark without the annotation is counted, not taken as the end
			t.Errorf("watchlist b: %+v", fb.report)
		}
	}

	e := newFake(t, "100")
	e.envelopedFrames = true
	se := httptest.NewServer(e)
	defer se.Close()
	fa := c.fetch(server{base: sa.URL, hc: sa.Client()}, spec, "watchlist")
	fe := c.fetch(server{base: se.URL, hc: se.Client()}, spec, "watchlist")
	line := fidelityLine{}
	compareFetched(&line, fa, fe)
	if line.OK || len(line.Differences) == 0 || !strings.Contains(line.Differences[0], "b: watch frame: enveloped") {
		t.Errorf("enveloped frames: %+v", line)
	}
}

func TestSplitList(t *testing.T) {
	msg := listMessage(t, "7", [][]byte{[]byte("one"), {}, []byte("three")})
	lm, items, err := splitList(msg)
	if err != nil || len(items) != 3 || !bytes.Equal(items[0], []byte("one")) || len(items[1]) != 0 || !bytes.Equal(items[2], []byte("three")) {
		t.Fatalf("items %q err %v", items, err)
	}
	var meta metav1.ListMeta
	if err := meta.Unmarshal(lm); err != nil || meta.ResourceVersion != "7" {
		t.Errorf("list meta %+v %v", meta, err)
	}
	if _, _, err := splitList([]byte{0x12, 0x05, 'a'}); err == nil {
		t.Error("truncated item: no error")
	}
}

func TestCollectionPath(t *testing.T) {
	for in, want := range map[string]string{
		"v1/configmaps":          "/api/v1/configmaps",
		"v1/pods@ns1":            "/api/v1/namespaces/ns1/pods",
		"apps/v1/deployments@x":  "/apis/apps/v1/namespaces/x/deployments",
		"example.com/v1/widgets": "/apis/example.com/v1/widgets",
	} {
		s, err := parseResourceSpec(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := collectionPath(s); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
}

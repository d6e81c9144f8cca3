package main

// --mode fidelity: the same protobuf reads from two servers (the apiserver and warmwatch),
// decoded with client-go's own codecs and compared item by item, decoded and byte for byte.

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/util/diff"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// The Accept headers of the three reads: a typed protobuf client's LIST and WATCH
// (kube-controller-manager's), and client-go's metadata client's LIST without its JSON
// fallbacks, so an answer in JSON is a difference, not a silent fallback.
const (
	acceptProtobuf         = protobufContentType
	acceptMetadataProtobuf = protobufContentType + ";as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
)

var protobufMagic = []byte{0x6b, 0x38, 0x73, 0x00}

// maxDifferences caps the differences listed per check (the flags still say it all).
const maxDifferences = 20

// fidelityScheme holds client-go's built-in types plus meta.k8s.io/v1's
// PartialObjectMetadata[List] (what client-go's metadata client decodes with).
func fidelityScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := metav1.AddMetaToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// sideReport is what one server answered to one check.
type sideReport struct {
	URL         string `json:"url"`
	Status      int    `json:"status"`
	ContentType string `json:"contentType"`
	Error       string `json:"error,omitempty"`
	// The envelope's type: the list's ("<apiVersion> <kind>"), or for a watch the event
	// types of its WatchEvent frames and the envelopes of the ADDED objects inside them.
	Envelope       string `json:"envelope,omitempty"`
	ObjectEnvelope string `json:"objectEnvelope,omitempty"`
	// RV: the list's resourceVersion, or the initial-events-end bookmark's.
	RV    string `json:"rv"`
	Count int    `json:"count"`
	Bytes int    `json:"bytes"`
	// Watch only: the bookmark's annotations, and other bookmarks seen before it.
	BookmarkAnnotations map[string]string `json:"bookmarkAnnotations,omitempty"`
	BookmarkRaw         string            `json:"bookmarkRaw,omitempty"` // hex of its message bytes
	OtherBookmarks      int               `json:"otherBookmarks,omitempty"`
}

// fidelityLine is one check's comparison, {"kind":"fidelity",...}.
type fidelityLine struct {
	Kind     string     `json:"kind"`
	Resource string     `json:"resource"`
	Check    string     `json:"check"` // list | watchlist | metadata-list
	A        sideReport `json:"a"`
	B        sideReport `json:"b"`
	// SameKeys: the same set of (namespace, name, resourceVersion). The other comparisons
	// are over the items both have.
	SameKeys bool `json:"sameKeys"`
	// DecodedEqual: reflect.DeepEqual of the decoded objects; SemanticEqual: apiequality.
	DecodedEqual  bool `json:"decodedEqual"`
	SemanticEqual bool `json:"semanticEqual"`
	// RawEqual: each item's protobuf message bytes are identical.
	RawEqual bool `json:"rawEqual"`
	// EnvelopeEqual: content type, envelope types and encodings, list metadata other than
	// the resourceVersion (continue, remainingItemCount), the bookmark apart from its RV.
	EnvelopeEqual bool `json:"envelopeEqual"`
	// SameOrder: items in the same order (informational: clients do not depend on it).
	SameOrder bool `json:"sameOrder"`
	// BookmarkEqual (watchlist only, not part of OK): the initial-events-end bookmark objects
	// decode equal once their resourceVersions are cleared. client-go reads only their RV and
	// annotation; the apiserver's carry its conversion's defaults (e.g. a Deployment's
	// spec.replicas=0).
	BookmarkEqual *bool    `json:"bookmarkEqual,omitempty"`
	OK            bool     `json:"ok"`
	Differences   []string `json:"differences,omitempty"`
}

// fetchedItem is one object of an answer: its key, its own protobuf message bytes (no
// envelope) and its decoded form.
type fetchedItem struct {
	key     [3]string
	raw     []byte
	decoded runtime.Object
}

// fetched is one answer, parsed.
type fetched struct {
	report sideReport
	// envelopeFacts: everything compared for EnvelopeEqual (minus the list RV).
	envelopeFacts []string
	items         []fetchedItem
	// bookmark: the initial-events-end bookmark's object, RV cleared (watch only).
	bookmark runtime.Object
	problems []string // protocol errors found while parsing
}

type fidelityChecker struct {
	ser     *protobuf.Serializer
	timeout time.Duration
	rv      string
	labels  string
}

func newFidelityChecker(timeout time.Duration, rv, labelSelector string) *fidelityChecker {
	s := fidelityScheme()
	return &fidelityChecker{ser: protobuf.NewSerializer(s, s), timeout: timeout, rv: rv, labels: labelSelector}
}

// collectionPath: /api/v1[/namespaces/NS]/RESOURCE or /apis/G/V[/namespaces/NS]/RESOURCE.
func collectionPath(s resourceSpec) string {
	var b strings.Builder
	if s.GVR.Group == "" {
		b.WriteString("/api/" + s.GVR.Version)
	} else {
		b.WriteString("/apis/" + s.GVR.Group + "/" + s.GVR.Version)
	}
	if s.Namespace != "" {
		b.WriteString("/namespaces/" + url.PathEscape(s.Namespace))
	}
	b.WriteString("/" + s.GVR.Resource)
	return b.String()
}

// server is one side: base URL and an authenticated HTTP client.
type server struct {
	base string
	hc   *http.Client
}

func serverFor(cfg *rest.Config) (server, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return server{}, err
	}
	host := cfg.Host
	if !strings.Contains(host, "://") {
		host = "https://" + host
	}
	return server{base: strings.TrimRight(host, "/") + strings.TrimRight(cfg.APIPath, "/"), hc: hc}, nil
}

func (c *fidelityChecker) query(watch bool) string {
	q := url.Values{}
	if c.rv != "" {
		q.Set("resourceVersion", c.rv)
	}
	if c.labels != "" {
		q.Set("labelSelector", c.labels)
	}
	if watch {
		q.Set("watch", "true")
		q.Set("sendInitialEvents", "true")
		q.Set("resourceVersionMatch", "NotOlderThan")
		q.Set("allowWatchBookmarks", "true")
		q.Set("timeoutSeconds", fmt.Sprint(int(c.timeout.Seconds())))
	}
	return q.Encode()
}

// get sends one GET; the caller closes the body when err is nil.
func (c *fidelityChecker) get(ctx context.Context, srv server, u, accept string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", accept)
	req.Header.Set("User-Agent", "warmwatch-goclient/fidelity "+rest.DefaultKubernetesUserAgent())
	return srv.hc.Do(req)
}

func (c *fidelityChecker) fetch(srv server, spec resourceSpec, check string) *fetched {
	accept := acceptProtobuf
	if check == "metadata-list" {
		accept = acceptMetadataProtobuf
	}
	u := srv.base + collectionPath(spec)
	if q := c.query(check == "watchlist"); q != "" {
		u += "?" + q
	}
	f := &fetched{report: sideReport{URL: u}}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout+10*time.Second)
	defer cancel()
	resp, err := c.get(ctx, srv, u, accept)
	if err != nil {
		f.report.Error = err.Error()
		return f
	}
	defer func() { _ = resp.Body.Close() }()
	f.report.Status = resp.StatusCode
	f.report.ContentType = resp.Header.Get("Content-Type")
	f.envelopeFacts = append(f.envelopeFacts, "status "+fmt.Sprint(resp.StatusCode), "content-type "+f.report.ContentType)
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		f.report.Error = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, bytes.ToValidUTF8(body, []byte("?")))
		return f
	}
	if check == "watchlist" {
		c.parseWatchList(resp.Body, f)
	} else {
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			f.report.Error = "reading body: " + err.Error()
			return f
		}
		c.parseList(check, body, f)
	}
	f.report.Count = len(f.items)
	return f
}

// unwrap strips the protobuf magic and decodes the runtime.Unknown envelope.
func unwrap(data []byte) (*runtime.Unknown, error) {
	if !bytes.HasPrefix(data, protobufMagic) {
		n := min(len(data), 16)
		return nil, fmt.Errorf("not a protobuf message (starts %q)", data[:n])
	}
	unk := &runtime.Unknown{}
	if err := unk.Unmarshal(data[len(protobufMagic):]); err != nil {
		return nil, fmt.Errorf("runtime.Unknown: %w", err)
	}
	return unk, nil
}

func envelopeText(unk *runtime.Unknown) string {
	return fmt.Sprintf("%s %s encoding=%q contentType=%q", unk.APIVersion, unk.Kind, unk.ContentEncoding, unk.ContentType)
}

// splitList returns a list message's ListMeta bytes and its items' message bytes
// (field 1 and the repeated field 2 of every Kubernetes *List message).
func splitList(raw []byte) (listMeta []byte, items [][]byte, err error) {
	for len(raw) > 0 {
		num, typ, n := protowire.ConsumeTag(raw)
		if n < 0 {
			return nil, nil, protowire.ParseError(n)
		}
		raw = raw[n:]
		if typ != protowire.BytesType {
			m := protowire.ConsumeFieldValue(num, typ, raw)
			if m < 0 {
				return nil, nil, protowire.ParseError(m)
			}
			raw = raw[m:]
			continue
		}
		v, m := protowire.ConsumeBytes(raw)
		if m < 0 {
			return nil, nil, protowire.ParseError(m)
		}
		raw = raw[m:]
		switch num {
		case 1:
			listMeta = v
		case 2:
			items = append(items, v)
		}
	}
	return listMeta, items, nil
}

func keyOf(obj runtime.Object) ([3]string, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return [3]string{}, err
	}
	return [3]string{m.GetNamespace(), m.GetName(), m.GetResourceVersion()}, nil
}

func (c *fidelityChecker) parseList(check string, body []byte, f *fetched) {
	f.report.Bytes = len(body)
	unk, err := unwrap(body)
	if err != nil {
		f.problems = append(f.problems, check+": "+err.Error())
		return
	}
	f.report.Envelope = unk.APIVersion + " " + unk.Kind
	f.envelopeFacts = append(f.envelopeFacts, "envelope "+envelopeText(unk))
	decoded, _, err := c.ser.Decode(body, nil, nil)
	if err != nil {
		f.problems = append(f.problems, check+": client-go decode: "+err.Error())
		return
	}
	listAcc, err := meta.ListAccessor(decoded)
	if err != nil {
		f.problems = append(f.problems, fmt.Sprintf("%s: decoded %T is not a list: %v", check, decoded, err))
		return
	}
	f.report.RV = listAcc.GetResourceVersion()
	remaining := "nil"
	if r := listAcc.GetRemainingItemCount(); r != nil {
		remaining = fmt.Sprint(*r)
	}
	f.envelopeFacts = append(f.envelopeFacts,
		fmt.Sprintf("decoded %T", decoded),
		"continue "+listAcc.GetContinue(),
		"remainingItemCount "+remaining,
		"selfLink "+listAcc.GetSelfLink())
	objs, err := meta.ExtractList(decoded)
	if err != nil {
		f.problems = append(f.problems, check+": items: "+err.Error())
		return
	}
	_, raws, err := splitList(unk.Raw)
	if err != nil {
		f.problems = append(f.problems, check+": splitting items: "+err.Error())
		return
	}
	if len(raws) != len(objs) {
		f.problems = append(f.problems, fmt.Sprintf("%s: %d raw items but client-go decoded %d", check, len(raws), len(objs)))
		return
	}
	for i, obj := range objs {
		k, err := keyOf(obj)
		if err != nil {
			f.problems = append(f.problems, fmt.Sprintf("%s item %d: %v", check, i, err))
			continue
		}
		f.items = append(f.items, fetchedItem{key: k, raw: raws[i], decoded: obj})
	}
}

// readFrame reads one length-delimited protobuf watch frame (4-byte big-endian length).
func readFrame(r io.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > 256<<20 {
		return nil, fmt.Errorf("frame of %d bytes", size)
	}
	frame := make([]byte, size)
	if _, err := io.ReadFull(r, frame); err != nil {
		return nil, fmt.Errorf("short frame: %w", err)
	}
	return frame, nil
}

// parseWatchList reads ADDED events until the initial-events-end bookmark.
func (c *fidelityChecker) parseWatchList(body io.Reader, f *fetched) {
	frameEnvelopes := map[string]bool{} // event types seen
	objectEnvelopes := map[string]bool{}
	defer func() {
		f.report.Envelope = "WatchEvent " + strings.Join(slices.Sorted(maps.Keys(frameEnvelopes)), ",")
		f.report.ObjectEnvelope = strings.Join(slices.Sorted(maps.Keys(objectEnvelopes)), "; ")
		f.envelopeFacts = append(f.envelopeFacts, "frames "+f.report.Envelope, "objects "+f.report.ObjectEnvelope)
	}()
	for {
		frame, err := readFrame(body)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("stream ended before the initial-events-end bookmark")
			}
			f.problems = append(f.problems, "watch: "+err.Error())
			return
		}
		f.report.Bytes += 4 + len(frame)
		// A frame is a bare metav1.WatchEvent message (client-go's stream serializer is
		// protobuf.RawSerializer); its object is enveloped (magic + runtime.Unknown).
		if bytes.HasPrefix(frame, protobufMagic) {
			f.problems = append(f.problems, "watch frame: enveloped (starts with the protobuf magic), want a bare WatchEvent message")
			return
		}
		var event metav1.WatchEvent
		if err := event.Unmarshal(frame); err != nil {
			f.problems = append(f.problems, "watch frame: metav1.WatchEvent: "+err.Error())
			return
		}
		frameEnvelopes[event.Type] = true
		inner, err := unwrap(event.Object.Raw)
		if err != nil {
			f.problems = append(f.problems, fmt.Sprintf("watch %s event object: %v", event.Type, err))
			return
		}
		decoded, _, err := c.ser.Decode(event.Object.Raw, nil, nil)
		if err != nil {
			f.problems = append(f.problems, fmt.Sprintf("watch %s event: client-go decode: %v", event.Type, err))
			return
		}
		switch event.Type {
		case "ADDED":
			objectEnvelopes[envelopeText(inner)] = true
			k, err := keyOf(decoded)
			if err != nil {
				f.problems = append(f.problems, "watch ADDED: "+err.Error())
				continue
			}
			f.items = append(f.items, fetchedItem{key: k, raw: inner.Raw, decoded: decoded})
		case "BOOKMARK":
			m, err := meta.Accessor(decoded)
			if err != nil {
				f.problems = append(f.problems, "watch BOOKMARK: "+err.Error())
				return
			}
			if m.GetAnnotations()[metav1.InitialEventsAnnotationKey] != "true" {
				f.report.OtherBookmarks++
				continue
			}
			f.report.RV = m.GetResourceVersion()
			f.report.BookmarkAnnotations = m.GetAnnotations()
			f.report.BookmarkRaw = hex.EncodeToString(inner.Raw)
			f.envelopeFacts = append(f.envelopeFacts, "bookmark envelope "+envelopeText(inner), fmt.Sprintf("bookmark decoded %T", decoded))
			m.SetResourceVersion("")
			f.bookmark = decoded
			return
		default:
			f.problems = append(f.problems, fmt.Sprintf("watch: %s event before the initial-events-end bookmark: %s", event.Type, bytes.ToValidUTF8(inner.Raw, []byte("?"))))
			return
		}
	}
}

func keyText(k [3]string) string {
	if k[0] == "" {
		return fmt.Sprintf("%s@%s", k[1], k[2])
	}
	return fmt.Sprintf("%s/%s@%s", k[0], k[1], k[2])
}

// firstDifference is the index of the first differing byte (or the shorter length).
func firstDifference(a, b []byte) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// compareFetched fills the comparison flags of line from two parsed answers.
func compareFetched(line *fidelityLine, a, b *fetched) {
	var diffs []string
	note := func(format string, args ...interface{}) {
		diffs = append(diffs, fmt.Sprintf(format, args...))
	}
	for _, p := range a.problems {
		note("a: %s", p)
	}
	for _, p := range b.problems {
		note("b: %s", p)
	}
	if a.report.Error != "" {
		note("a: %s", a.report.Error)
	}
	if b.report.Error != "" {
		note("b: %s", b.report.Error)
	}
	healthy := len(diffs) == 0

	line.EnvelopeEqual = healthy && slices.Equal(a.envelopeFacts, b.envelopeFacts)
	if healthy && !line.EnvelopeEqual {
		note("envelope: a %q, b %q", a.envelopeFacts, b.envelopeFacts)
	}
	if healthy && (a.bookmark != nil || b.bookmark != nil) {
		equal := a.bookmark != nil && b.bookmark != nil && reflect.DeepEqual(a.bookmark, b.bookmark)
		line.BookmarkEqual = &equal
		if !equal {
			note("initial-events-end bookmark (RV aside) differs (a -, b +):\n%s", diff.Diff(a.bookmark, b.bookmark))
		}
	}

	byKeyB := map[[3]string]fetchedItem{}
	for _, it := range b.items {
		byKeyB[it.key] = it
	}
	keysA := make([][3]string, len(a.items))
	for i, it := range a.items {
		keysA[i] = it.key
	}
	keysB := make([][3]string, len(b.items))
	for i, it := range b.items {
		keysB[i] = it.key
	}
	line.SameOrder = healthy && slices.Equal(keysA, keysB)
	line.DecodedEqual, line.SemanticEqual, line.RawEqual = healthy, healthy, healthy
	seenA := map[[3]string]bool{}
	for _, ia := range a.items {
		if seenA[ia.key] {
			note("a: %s twice", keyText(ia.key))
			line.DecodedEqual, line.SemanticEqual, line.RawEqual = false, false, false
		}
		seenA[ia.key] = true
		ib, ok := byKeyB[ia.key]
		if !ok {
			continue
		}
		if !reflect.DeepEqual(ia.decoded, ib.decoded) {
			line.DecodedEqual = false
			note("%s: decoded objects differ (a -, b +):\n%s", keyText(ia.key), truncate(diff.Diff(ia.decoded, ib.decoded), 2000))
		}
		if !apiequality.Semantic.DeepEqual(ia.decoded, ib.decoded) {
			line.SemanticEqual = false
		}
		if !bytes.Equal(ia.raw, ib.raw) {
			line.RawEqual = false
			note("%s: raw protobuf differs: a %d bytes, b %d bytes, first difference at byte %d", keyText(ia.key), len(ia.raw), len(ib.raw), firstDifference(ia.raw, ib.raw))
		}
	}
	var onlyA, onlyB []string
	for _, it := range a.items {
		if _, ok := byKeyB[it.key]; !ok {
			onlyA = append(onlyA, keyText(it.key))
		}
	}
	for _, it := range b.items {
		if !seenA[it.key] {
			onlyB = append(onlyB, keyText(it.key))
		}
	}
	sort.Strings(onlyA)
	sort.Strings(onlyB)
	line.SameKeys = healthy && len(onlyA) == 0 && len(onlyB) == 0 && len(a.items) == len(b.items)
	if len(onlyA) > 0 {
		note("only in a: %s", truncate(strings.Join(onlyA, " "), 2000))
	}
	if len(onlyB) > 0 {
		note("only in b: %s", truncate(strings.Join(onlyB, " "), 2000))
	}
	line.OK = healthy && line.SameKeys && line.DecodedEqual && line.SemanticEqual && line.RawEqual && line.EnvelopeEqual
	if len(diffs) > maxDifferences {
		diffs = append(diffs[:maxDifferences], fmt.Sprintf("... %d more", len(diffs)-maxDifferences))
	}
	line.Differences = diffs
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// fidelityChecks are the three reads, in order.
var fidelityChecks = []string{"list", "watchlist", "metadata-list"}

// runFidelity runs every check for every resource against both servers; it prints one
// fidelity line per check and returns whether all were OK.
func runFidelity(c *fidelityChecker, a, b server, specs []resourceSpec, checks []string) bool {
	ok := true
	for _, spec := range specs {
		for _, check := range checks {
			line := fidelityLine{Kind: "fidelity", Resource: spec.Spec, Check: check}
			fa := c.fetch(a, spec, check)
			fb := c.fetch(b, spec, check)
			line.A, line.B = fa.report, fb.report
			compareFetched(&line, fa, fb)
			out.emit(line)
			ok = ok && line.OK
		}
	}
	return ok
}

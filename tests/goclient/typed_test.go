package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
)

// recorder is an apiserver that answers every request 500 and remembers its Accept header.
type recorder struct {
	mu      sync.Mutex
	accepts map[string]string // "LIST" / "WATCH" -> Accept
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	verb := "LIST"
	if req.URL.Query().Get("watch") == "true" {
		verb = "WATCH"
	}
	r.mu.Lock()
	r.accepts[verb] = req.Header.Get("Accept")
	r.mu.Unlock()
	http.Error(w, "no", http.StatusInternalServerError)
}

// acceptsOf issues one LIST and one WATCH of configmaps with the given client calls.
func acceptsOf(t *testing.T, protobuf, json bool, list, watch func(cfg *rest.Config) error) map[string]string {
	t.Helper()
	rec := &recorder{accepts: map[string]string{}}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	cfg := &rest.Config{Host: srv.URL}
	if protobuf {
		useProtobuf(cfg)
	}
	if json {
		useJSON(cfg)
	}
	_ = list(cfg)
	_ = watch(cfg)
	return rec.accepts
}

var configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

func TestProtobufAcceptHeaders(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	typed := func(protobuf, json bool) map[string]string {
		return acceptsOf(t, protobuf, json, func(cfg *rest.Config) error {
			cs, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = cs.CoreV1().ConfigMaps("ns").List(ctx, metav1.ListOptions{})
			return err
		}, func(cfg *rest.Config) error {
			cs, _ := kubernetes.NewForConfig(cfg)
			_, err := cs.CoreV1().ConfigMaps("ns").Watch(ctx, metav1.ListOptions{})
			return err
		})
	}
	metadataClient := func(protobuf bool) map[string]string {
		return acceptsOf(t, protobuf, false, func(cfg *rest.Config) error {
			mc, err := metadata.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = mc.Resource(configMaps).Namespace("ns").List(ctx, metav1.ListOptions{})
			return err
		}, func(cfg *rest.Config) error {
			mc, _ := metadata.NewForConfig(cfg)
			_, err := mc.Resource(configMaps).Namespace("ns").Watch(ctx, metav1.ListOptions{})
			return err
		})
	}

	// Typed clients: exactly kube-controller-manager's header with --protobuf, and (client-go
	// 1.37) by default too; JSON only when asked for.
	if got := typed(true, false); got["LIST"] != protobufAccept || got["WATCH"] != protobufAccept {
		t.Errorf("typed --protobuf: %v, want %q", got, protobufAccept)
	}
	if got := typed(false, false); got["LIST"] != protobufAccept || got["WATCH"] != protobufAccept {
		t.Errorf("typed (default): %v, want %q", got, protobufAccept)
	}
	if got := typed(false, true); got["LIST"] != "application/json, */*" || got["WATCH"] != "application/json, */*" {
		t.Errorf("typed --json: %v, want application/json, */*", got)
	}

	// The metadata client sends its protobuf-first PartialObjectMetadata[List] header
	// whatever the config says (metadata.ConfigFor overwrites it).
	wantList := "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
	wantWatch := strings.ReplaceAll(wantList, "PartialObjectMetadataList", "PartialObjectMetadata")
	for _, protobuf := range []bool{true, false} {
		if got := metadataClient(protobuf); got["LIST"] != wantList || got["WATCH"] != wantWatch {
			t.Errorf("metadata (protobuf=%v): %v, want LIST %q WATCH %q", protobuf, got, wantList, wantWatch)
		}
	}
}

func TestSetupTypedKnowsBuiltInResourcesOnly(t *testing.T) {
	cfg := &rest.Config{Host: "http://127.0.0.1:1"}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	handler := func(string) toolscache.ResourceEventHandler { return toolscache.ResourceEventHandlerFuncs{} }
	spec := func(s string) resourceSpec {
		r, err := parseResourceSpec(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	ws, _, err := setupTyped(setupParams{cfg: cfg, hc: hc, handlerFor: handler, specs: []resourceSpec{
		spec("v1/configmaps@a"), spec("apps/v1/deployments"), spec("v1/pods@a"),
	}})
	if err != nil || len(ws) != 3 {
		t.Fatalf("built-in resources: %v, %d informers", err, len(ws))
	}
	_, _, err = setupTyped(setupParams{cfg: cfg, hc: hc, handlerFor: handler, specs: []resourceSpec{spec("example.com/v1/widgets")}})
	if err == nil || !strings.Contains(err.Error(), "built-in resources only") {
		t.Errorf("a custom resource: %v", err)
	}
}

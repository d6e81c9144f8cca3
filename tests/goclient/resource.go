package main

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// resourceSpec is one --resource flag: a GVR and an optional namespace.
type resourceSpec struct {
	// Spec is the flag value as given (trimmed); it names the resource in every
	// output line.
	Spec      string
	GVR       schema.GroupVersionResource
	Namespace string // "" = all namespaces

	// Filled by discovery (empty with --no-discovery).
	Kind       string
	Namespaced bool
}

// parseResourceSpec parses "v1/configmaps", "apps/v1/deployments",
// "example.com/v1/widgets", each with an optional "@NAMESPACE" suffix.
func parseResourceSpec(s string) (resourceSpec, error) {
	spec := strings.TrimSpace(s)
	r := resourceSpec{Spec: spec}
	gvrPart := spec
	if i := strings.LastIndex(spec, "@"); i >= 0 {
		gvrPart, r.Namespace = spec[:i], spec[i+1:]
		if r.Namespace == "" {
			return r, fmt.Errorf("resource %q: empty namespace after @", s)
		}
		if strings.Contains(r.Namespace, "/") {
			return r, fmt.Errorf("resource %q: bad namespace %q", s, r.Namespace)
		}
	}
	parts := strings.Split(gvrPart, "/")
	for _, p := range parts {
		if p == "" || strings.TrimSpace(p) != p {
			return r, fmt.Errorf("resource %q: want [GROUP/]VERSION/RESOURCE[@NAMESPACE]", s)
		}
	}
	switch len(parts) {
	case 2:
		r.GVR = schema.GroupVersionResource{Version: parts[0], Resource: parts[1]}
	case 3:
		r.GVR = schema.GroupVersionResource{Group: parts[0], Version: parts[1], Resource: parts[2]}
	default:
		return r, fmt.Errorf("resource %q: want [GROUP/]VERSION/RESOURCE[@NAMESPACE]", s)
	}
	return r, nil
}

// groupVersion returns the discovery path form: "v1" or "apps/v1".
func (r resourceSpec) groupVersion() string {
	return r.GVR.GroupVersion().String()
}

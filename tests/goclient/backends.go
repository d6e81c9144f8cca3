package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// watched is one --resource with its handler registration and a way to read
// the informer's store.
type watched struct {
	spec resourceSpec
	reg  toolscache.ResourceEventHandlerRegistration
	list func() []interface{}
}

type setupParams struct {
	cfg           *rest.Config
	hc            *http.Client
	specs         []resourceSpec
	resync        time.Duration
	labelSelector string
	handlerFor    func(spec string) toolscache.ResourceEventHandler
}

// start runs the informers until ctx is done (non-blocking).
type startFunc func(ctx context.Context)

// setupInformer: client-go dynamic shared informer factories, one per namespace.
func setupInformer(p setupParams) ([]*watched, startFunc, error) {
	dyn, err := dynamic.NewForConfigAndClient(p.cfg, p.hc)
	if err != nil {
		return nil, nil, err
	}
	factories := map[string]dynamicinformer.DynamicSharedInformerFactory{}
	var out []*watched
	for _, s := range p.specs {
		f, ok := factories[s.Namespace]
		if !ok {
			f = dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, p.resync, s.Namespace, tweak(p.labelSelector))
			factories[s.Namespace] = f
		}
		inf := f.ForResource(s.GVR).Informer()
		reg, err := inf.AddEventHandler(p.handlerFor(s.Spec))
		if err != nil {
			return nil, nil, fmt.Errorf("%s: add handler: %w", s.Spec, err)
		}
		out = append(out, &watched{spec: s, reg: reg, list: inf.GetStore().List})
	}
	return out, func(ctx context.Context) {
		for _, f := range factories {
			f.Start(ctx.Done())
		}
	}, nil
}

// setupMetadata: client-go metadata informer factories (PartialObjectMetadata).
func setupMetadata(p setupParams) ([]*watched, startFunc, error) {
	mc, err := metadata.NewForConfigAndClient(p.cfg, p.hc)
	if err != nil {
		return nil, nil, err
	}
	factories := map[string]metadatainformer.SharedInformerFactory{}
	var out []*watched
	for _, s := range p.specs {
		f, ok := factories[s.Namespace]
		if !ok {
			f = metadatainformer.NewFilteredSharedInformerFactory(mc, p.resync, s.Namespace, tweak(p.labelSelector))
			factories[s.Namespace] = f
		}
		inf := f.ForResource(s.GVR).Informer()
		reg, err := inf.AddEventHandler(p.handlerFor(s.Spec))
		if err != nil {
			return nil, nil, fmt.Errorf("%s: add handler: %w", s.Spec, err)
		}
		out = append(out, &watched{spec: s, reg: reg, list: inf.GetStore().List})
	}
	return out, func(ctx context.Context) {
		for _, f := range factories {
			f.Start(ctx.Done())
		}
	}, nil
}

// setupControllerRuntime: one controller-runtime cache with unstructured
// objects; GVR→GVK through a discovery-backed dynamic RESTMapper.
func setupControllerRuntime(ctx context.Context, p setupParams) ([]*watched, startFunc, error) {
	mapper, err := apiutil.NewDynamicRESTMapper(p.cfg, p.hc)
	if err != nil {
		return nil, nil, fmt.Errorf("restmapper: %w", err)
	}
	var sel labels.Selector
	if p.labelSelector != "" {
		if sel, err = labels.Parse(p.labelSelector); err != nil {
			return nil, nil, fmt.Errorf("--label-selector: %w", err)
		}
	}

	// The underlying client-go informers, recorded as controller-runtime
	// creates them, so the digest reads their stores directly (the cache's
	// List would block until synced).
	var mu sync.Mutex
	informers := map[schema.GroupVersionKind][]toolscache.SharedIndexInformer{}
	newInformer := func(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, idx toolscache.Indexers) toolscache.SharedIndexInformer {
		inf := toolscache.NewSharedIndexInformer(lw, obj, resync, idx)
		gvk := obj.GetObjectKind().GroupVersionKind()
		mu.Lock()
		informers[gvk] = append(informers[gvk], inf)
		mu.Unlock()
		return inf
	}

	type entry struct {
		spec resourceSpec
		obj  *unstructured.Unstructured
	}
	seen := map[schema.GroupVersionResource]string{}
	var entries []entry
	byObject := map[client.Object]crcache.ByObject{}
	for _, s := range p.specs {
		if prev, dup := seen[s.GVR]; dup {
			return nil, nil, fmt.Errorf("controller-runtime mode: %s and %s are the same type; one cache holds one informer set per type", prev, s.Spec)
		}
		seen[s.GVR] = s.Spec
		gvk, err := mapper.KindFor(s.GVR)
		if err != nil {
			return nil, nil, fmt.Errorf("unknown resource %s: %w", s.Spec, err)
		}
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(gvk)
		if s.Namespace != "" {
			byObject[u] = crcache.ByObject{
				Namespaces: map[string]crcache.Config{s.Namespace: {LabelSelector: sel}},
				Label:      sel,
			}
		}
		entries = append(entries, entry{s, u})
	}

	resync := p.resync
	c, err := crcache.New(p.cfg, crcache.Options{
		HTTPClient:           p.hc,
		Mapper:               mapper,
		SyncPeriod:           &resync,
		DefaultLabelSelector: sel,
		ByObject:             byObject,
		NewInformer:          newInformer,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("controller-runtime cache: %w", err)
	}

	var out []*watched
	for _, e := range entries {
		inf, err := c.GetInformer(ctx, e.obj, crcache.BlockUntilSynced(false))
		if err != nil {
			return nil, nil, fmt.Errorf("%s: informer: %w", e.spec.Spec, err)
		}
		reg, err := inf.AddEventHandler(p.handlerFor(e.spec.Spec))
		if err != nil {
			return nil, nil, fmt.Errorf("%s: add handler: %w", e.spec.Spec, err)
		}
		gvk := e.obj.GroupVersionKind()
		out = append(out, &watched{spec: e.spec, reg: reg, list: func() []interface{} {
			mu.Lock()
			infs := append([]toolscache.SharedIndexInformer(nil), informers[gvk]...)
			mu.Unlock()
			var all []interface{}
			for _, inf := range infs {
				all = append(all, inf.GetStore().List()...)
			}
			return all
		}})
	}
	return out, func(ctx context.Context) {
		go func() {
			if err := c.Start(ctx); err != nil {
				klog.ErrorS(err, "controller-runtime cache stopped")
			}
		}()
	}, nil
}

// tweak applies --label-selector to every list and watch.
func tweak(selector string) func(*metav1.ListOptions) {
	if selector == "" {
		return nil
	}
	return func(o *metav1.ListOptions) { o.LabelSelector = selector }
}

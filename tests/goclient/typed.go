package main

import (
	"context"
	"fmt"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Content types a protobuf-preferring client-go program sets on its rest.Config, exactly as
// kube-controller-manager does (its --kube-api-content-type default, and client-go's
// AcceptContentTypes for it).
const (
	protobufContentType = "application/vnd.kubernetes.protobuf"
	protobufAccept      = "application/vnd.kubernetes.protobuf,application/json"
)

// useProtobuf makes cfg's typed clients send and prefer protobuf.
//
// client-go 1.37's typed clients for built-in types already default to exactly this when
// the config names no content type (gentype.PrefersProtobuf, rest.Request.UseProtobufAsDefault),
// so on the wire --protobuf equals the default; it is set explicitly here, as
// kube-controller-manager sets it. --json (useJSON) is the way to a JSON typed client.
//
// Only typed clients (kubernetes.Clientset) are affected: client-go's dynamic client
// (informer and controller-runtime modes) always speaks JSON, and its metadata client always
// sends, whatever the config says, the Accept header
// "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,
// application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
// on LIST (as=PartialObjectMetadata on WATCH): metadata.ConfigFor overwrites both fields.
func useProtobuf(cfg *rest.Config) {
	cfg.ContentType = protobufContentType
	cfg.AcceptContentTypes = protobufAccept
}

// useJSON makes cfg's typed clients speak JSON ("Accept: application/json, */*").
func useJSON(cfg *rest.Config) {
	cfg.ContentType = "application/json"
	cfg.AcceptContentTypes = ""
}

// setupTyped: client-go typed shared informer factories (kubernetes.Clientset), one per
// namespace; built-in resources only (ForResource fails for anything else).
func setupTyped(p setupParams) ([]*watched, startFunc, error) {
	cs, err := kubernetes.NewForConfigAndClient(p.cfg, p.hc)
	if err != nil {
		return nil, nil, err
	}
	factories := map[string]informers.SharedInformerFactory{}
	var out []*watched
	for _, s := range p.specs {
		f, ok := factories[s.Namespace]
		if !ok {
			opts := []informers.SharedInformerOption{informers.WithNamespace(s.Namespace)}
			if t := tweak(p.labelSelector); t != nil {
				opts = append(opts, informers.WithTweakListOptions(t))
			}
			f = informers.NewSharedInformerFactoryWithOptions(cs, p.resync, opts...)
			factories[s.Namespace] = f
		}
		gi, err := f.ForResource(s.GVR)
		if err != nil {
			return nil, nil, fmt.Errorf("resource %s: no typed informer (built-in resources only): %w", s.Spec, err)
		}
		inf := gi.Informer()
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

// Command crmanager is a typed controller-runtime manager of the kind
// kubebuilder generates, for warmwatch's end-to-end tests: it mirrors every
// ConfigMap labelled warmwatch.test/mirror=true into <name>-mirror (same data,
// owner reference) and reports, as JSON lines on stdout, when its caches
// synced and every reconcile.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

type startLine struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Server    string `json:"server"`
}

type syncedLine struct {
	Kind      string `json:"kind"`
	Count     int    `json:"count"`
	ElapsedMs int64  `json:"elapsedMs"`
}

type reconcileLine struct {
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace"`
	Name       string `json:"name"`
	Result     string `json:"result"`
	SourceRV   string `json:"sourceRV,omitempty"`
	MirrorRV   string `json:"mirrorRV,omitempty"`
	Error      string `json:"error,omitempty"`
	DurationMs int64  `json:"durationMs"`
}

type kindLine struct {
	Kind    string `json:"kind"`
	Message string `json:"message,omitempty"`
}

// emitter writes one JSON object per line with a single Write each, so a
// reader sees whole lines as they happen.
type emitter struct {
	mu sync.Mutex
	w  io.Writer
}

func (e *emitter) emit(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(kindLine{Kind: "error", Message: "marshal: " + err.Error()})
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := e.w.Write(append(b, '\n')); err != nil {
		os.Exit(1) // the reader is gone
	}
}

var out = &emitter{w: os.Stdout}

func main() {
	var kubeconfig, namespace string
	fs := flag.NewFlagSet(os.Args[0], flag.ContinueOnError)
	fs.StringVar(&kubeconfig, "kubeconfig", "", "path to a kubeconfig (required)")
	fs.StringVar(&namespace, "namespace", "", "the one namespace to watch (required)")
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	klogFlags.VisitAll(func(f *flag.Flag) { fs.Var(f.Value, f.Name, f.Usage) })
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fail("%v", err)
	}
	if kubeconfig == "" || namespace == "" {
		fail("--kubeconfig and --namespace are required")
	}
	ctrl.SetLogger(klog.NewKlogr())
	if err := run(ctrl.SetupSignalHandler(), kubeconfig, namespace); err != nil {
		out.emit(kindLine{Kind: "error", Message: err.Error()})
		os.Exit(1)
	}
	out.emit(kindLine{Kind: "exit"})
}

// fail reports a start-up error and exits 2.
func fail(format string, args ...any) {
	out.emit(kindLine{Kind: "error", Message: fmt.Sprintf(format, args...)})
	os.Exit(2)
}

func run(ctx context.Context, kubeconfig, namespace string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.UserAgent = "warmwatch-crmanager"
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		LeaderElection:         false,
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{namespace: {}}},
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	reconciler := &MirrorReconciler{
		Client: mgr.GetClient(),
		Scheme: mgr.GetScheme(),
		Report: func(l reconcileLine) { out.emit(l) },
	}
	if err := reconciler.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	// The controller creates its informer only when it starts; creating it
	// now makes the cache's WaitForCacheSync below wait for it.
	if _, err := mgr.GetCache().GetInformer(ctx, &corev1.ConfigMap{}); err != nil {
		return fmt.Errorf("informer: %w", err)
	}
	started := time.Now()
	err = mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return nil // stopping before the caches synced
		}
		var all corev1.ConfigMapList
		if err := mgr.GetCache().List(ctx, &all, client.InNamespace(namespace)); err != nil {
			return err
		}
		out.emit(syncedLine{Kind: "synced", Count: len(all.Items), ElapsedMs: time.Since(started).Milliseconds()})
		<-ctx.Done()
		return nil
	}))
	if err != nil {
		return err
	}
	out.emit(startLine{Kind: "start", Namespace: namespace, Server: cfg.Host})
	return mgr.Start(ctx)
}
